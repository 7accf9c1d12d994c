"""Frozen payloads encrypted at rest: unreadable in the database, readable through the
ledger (its reads, the review queue, a worker's claim), bound to their operation, and
rotated to a new key by `opledger payloads rotate` while the old key can then go."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from sqlalchemy import event

from opledger.cli.checks import run_checks
from opledger.ledger import Binding, Confirmed, IntentConflict, Ledger
from opledger.ledger.canonical import canonicalize
from opledger.ledger.payload_keys import PayloadKeyUnknown, PayloadUnreadable
from opledger.settings import Settings
from tests.conftest import SCHEMA, connect_ledger
from tests.intents import intent, prepare
from tests.wire import WireCounter

SECRET = {"note": "card ends 4242, call Ms Quinlan", "amount": 7319}
#: what no stored byte may show of SECRET
PLAIN = ("4242", "Quinlan", "7319", "note", "amount")


def new_key(key_id: str) -> str:
    return f"{key_id}:{base64.b64encode(os.urandom(32)).decode()}"


K1, K2 = new_key("k1"), new_key("k2")


@pytest.fixture
def ledgers(ledger: Ledger, database_url: str) -> Iterator[Callable[[str], Ledger]]:
    """Ledgers on the test database configured with the given OPLEDGER_PAYLOAD_KEYS text
    (the `ledger` fixture itself has none: it writes and reads in clear)."""
    opened: list[Ledger] = []

    def open_with(keys: str) -> Ledger:
        opened.append(Ledger.from_url(database_url, pool_size=1, payload_keys=keys))
        return opened[-1]

    yield open_with
    for each in opened:
        each.engine.dispose()


def raw_row(database_url: str, op_id: str) -> tuple[str | None, str | None, bytes | None, str]:
    """The payload row as the database holds it, and the whole row as text."""
    with connect_ledger(database_url) as conn:
        row = conn.execute(
            "SELECT canonical, key_id, sealed, p::text FROM operation_payloads AS p"
            " WHERE op_id = %s",
            (op_id,),
        ).fetchone()
    assert row is not None
    return row[0], row[1], None if row[2] is None else bytes(row[2]), row[3]


def test_a_sealed_payload_is_unreadable_in_the_database_and_readable_through_the_ledger(
    ledgers: Callable[[str], Ledger], ledger: Ledger, database_url: str, grant: str
) -> None:
    sealed = ledgers(K1)
    op = sealed.prepare(**intent("secret", payload=SECRET))

    canonical, key_id, ciphertext, whole = raw_row(database_url, op.id)
    assert canonical is None and key_id == "k1" and ciphertext is not None
    for word in PLAIN:
        assert word not in whole and word.encode() not in ciphertext, word

    assert sealed.payload(op.id) == SECRET
    assert sealed.reviews.payload(op.id, tenant="acme") == SECRET
    # the digest is the clear text's, as before: replays and conflicts compare digests
    assert op.payload_digest == canonicalize(SECRET).digest
    assert sealed.prepare(**intent("secret", payload=SECRET)).id == op.id
    with pytest.raises(IntentConflict):
        sealed.prepare(**intent("secret", payload={**SECRET, "amount": 1}))

    # a process without the key says which key id it lacks, never a key
    with pytest.raises(PayloadKeyUnknown, match="key 'k1'") as lacking:
        ledger.payload(op.id)
    assert K1.split(":")[1] not in str(lacking.value)


def test_the_keys_come_from_the_settings_never_from_the_ledger_reading_the_environment(
    database_url: str, grant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPLEDGER_PAYLOAD_KEYS", K1)
    configured = Ledger.from_url(
        database_url, pool_size=1, **Settings.from_environ(os.environ).ledger_options()
    )
    bare = Ledger.from_url(database_url, pool_size=1)
    try:
        sealed = configured.prepare(**intent("from-settings", payload=SECRET))
        assert raw_row(database_url, sealed.id)[1] == "k1"
        clear = bare.prepare(**intent("bare", payload=SECRET))  # the variable unread
        assert raw_row(database_url, clear.id)[1] is None
    finally:
        configured.engine.dispose()
        bare.engine.dispose()


def test_a_worker_claims_the_clear_payload_in_two_round_trips(
    ledgers: Callable[[str], Ledger], grant: str, request: pytest.FixtureRequest
) -> None:
    sealed = ledgers(K1)
    counter = WireCounter()
    request.addfinalizer(counter.file.close)
    event.listen(sealed.engine, "connect", counter.attach)
    warm = sealed.claim(prepare(sealed, "warm-up"), owner="w")  # first connect happens here
    assert warm is not None
    sealed.record_outcome(warm, Confirmed(receipt_id="r0"))
    op_id = sealed.prepare(**intent("claimed", payload=SECRET)).id

    counter.start()
    claim = sealed.claim(op_id, owner="w")
    assert claim is not None
    sealed.record_outcome(claim, Confirmed(receipt_id="r1"))
    assert counter.round_trips() == 2, counter.messages()

    assert claim.payload == SECRET
    assert claim.payload_canonical == canonicalize(SECRET).text
    digest = hashlib.sha256(claim.payload_canonical.encode()).hexdigest()
    assert digest == claim.operation.payload_digest


def test_a_sealed_payload_copied_onto_another_operation_does_not_decrypt(
    ledgers: Callable[[str], Ledger], database_url: str, grant: str
) -> None:
    sealed = ledgers(K1)
    source = sealed.prepare(**intent("source", payload=SECRET)).id
    target = prepare(sealed, "target")
    with connect_ledger(database_url) as conn:
        conn.execute(
            "UPDATE operation_payloads SET sealed ="
            " (SELECT sealed FROM operation_payloads WHERE op_id = %s) WHERE op_id = %s",
            (source, target),
        )
    with pytest.raises(PayloadUnreadable, match=target):
        sealed.payload(target)
    with pytest.raises(PayloadUnreadable):  # nor can a worker send it
        sealed.claim(target, owner="w")
    assert sealed.payload(source) == SECRET


def opledger(database_url: str, *args: str, keys: str | None) -> subprocess.CompletedProcess[str]:
    """The real `opledger ARGS` with these payload keys (none: the variable unset)."""
    env = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    env |= {"OPLEDGER_DATABASE_URL": database_url, "OPLEDGER_DATABASE_SCHEMA": SCHEMA}
    if keys is not None:
        env["OPLEDGER_PAYLOAD_KEYS"] = keys
    return subprocess.run(
        [sys.executable, "-m", "opledger.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_rotation_moves_every_row_to_the_new_key_and_the_old_key_can_go(
    ledgers: Callable[[str], Ledger], ledger: Ledger, database_url: str, grant: str
) -> None:
    clear = ledger.prepare(**intent("clear", payload=SECRET)).id  # before any key
    old = ledgers(K1).prepare(**intent("old", payload={**SECRET, "amount": 1})).id
    new = ledgers(f"{K2},{K1}").prepare(**intent("new", payload={**SECRET, "amount": 2})).id
    assert [raw_row(database_url, i)[1] for i in (clear, old, new)] == [None, "k1", "k2"]

    rotated = opledger(database_url, "payloads", "rotate", "--batch", "1", keys=f"{K2},{K1}")
    assert rotated.returncode == 0, rotated.stderr
    assert (
        "re-encrypted 2 payloads and result documents under key k2; 0 remain" in rotated.stdout
    ), rotated.stdout

    only_new = ledgers(K2)  # the old key removed from the configuration
    assert only_new.payload(clear) == SECRET
    assert only_new.payload(old) == {**SECRET, "amount": 1}
    assert only_new.payload(new) == {**SECRET, "amount": 2}
    for op_id in (clear, old, new):
        canonical, key_id, _, whole = raw_row(database_url, op_id)
        assert canonical is None and key_id == "k2" and "Quinlan" not in whole
    with pytest.raises(PayloadKeyUnknown, match="key 'k2'"):
        ledgers(K1).payload(old)

    again = opledger(database_url, "payloads", "rotate", "--batch", "500", keys=K2)
    assert again.returncode == 0, again.stderr
    assert "re-encrypted 0 payloads and result documents under key k2; 0 remain" in again.stdout, (
        again.stdout
    )


def test_rotation_skips_a_row_another_transaction_holds_and_says_it_remains(
    ledgers: Callable[[str], Ledger], ledger: Ledger, database_url: str, grant: str
) -> None:
    held, free = (ledger.prepare(**intent(k, payload=SECRET)).id for k in ("held", "free"))
    sealed = ledgers(K1)
    with connect_ledger(database_url) as conn:  # a purge or another rotation, mid-batch
        conn.execute("SELECT 1 FROM operation_payloads WHERE op_id = %s FOR UPDATE", (held,))
        done = sealed.rotate_payloads(batch=10)
        assert sealed.payload(held) == SECRET  # read as last committed, meanwhile
    assert (done.resealed, done.remaining) == (1, 1)
    assert [raw_row(database_url, i)[1] for i in (held, free)] == [None, "k1"]
    assert sealed.rotate_payloads().resealed == 1


def test_a_row_under_a_key_no_longer_configured_stops_the_rotation_unwritten(
    ledgers: Callable[[str], Ledger], ledger: Ledger, database_url: str, grant: str
) -> None:
    clear = ledger.prepare(**intent("a-clear", payload=SECRET)).id
    lost = ledgers(K1).prepare(**intent("b-lost", payload=SECRET)).id
    with pytest.raises(PayloadKeyUnknown, match=f"{lost}.*key 'k1'"):
        ledgers(K2).rotate_payloads(batch=10)
    assert raw_row(database_url, clear)[1] is None  # its batch rolled back

    refused = opledger(database_url, "payloads", "rotate", keys=None)
    assert refused.returncode == 4 and "OPLEDGER_PAYLOAD_KEYS is not set" in refused.stderr


def test_purge_deletes_sealed_payloads_and_the_digest_stays(
    ledgers: Callable[[str], Ledger], grant: str
) -> None:
    sealed = ledgers(K1)
    op = sealed.prepare(**intent("purged", payload=SECRET))
    claim = sealed.claim(op.id, owner="w")
    assert claim is not None
    sealed.record_outcome(claim, Confirmed(receipt_id="r"))
    assert sealed.purge_payloads(older_than=timedelta(0)) == 1
    assert sealed.payload(op.id) is None
    assert sealed.get(op.id).payload_digest == op.payload_digest


def test_check_warns_of_clear_payloads_and_names_key_ids_only() -> None:
    def payloads(env: dict[str, str]) -> tuple[bool, bool, str]:
        (check,) = [
            c for c in run_checks(env, broker=False, database=False) if c.name == "payloads"
        ]
        return check.ok, check.warning, check.detail

    ok, warning, detail = payloads({})
    assert not ok and warning and "stored in clear" in detail and "OPLEDGER_PAYLOAD_KEYS" in detail
    ok, _, detail = payloads({"OPLEDGER_PAYLOAD_KEYS": f"{K2},{K1}"})
    assert ok and detail == "encrypted under key k2, 1 older kept for reading"


RESULT = {"ticket": "T-9931", "holder": "Ms Quinlan", "amount": 7319}


def raw_results(database_url: str, op_id: str) -> list[str]:
    """The result documents as the database holds them: the attempts' and the evidence's."""
    with connect_ledger(database_url) as conn:
        return [
            json.dumps(row[0])
            for row in conn.execute(
                "SELECT response -> 'result' FROM attempts WHERE op_id = %s"
                " UNION ALL SELECT detail -> 'result' FROM evidence WHERE op_id = %s",
                (op_id, op_id),
            )
        ]


def test_result_data_is_sealed_like_the_payload_read_back_and_rotated(
    ledgers: Callable[[str], Ledger], ledger: Ledger, database_url: str, grant: str
) -> None:
    """The provider's result document (a confirmation's, a lookup's) is kept sealed in the
    attempt's response and the evidence's detail, bound to its operation, read back in
    clear through the ledger (what an agent gets as its data), and moved to a new key by
    the rotation like the payloads."""
    sealing = ledgers(K1)
    op_id = prepare(sealing, "result")
    claim = sealing.claim(op_id, owner="w1")
    assert claim is not None
    binding = Binding(idempotency_key=claim.idempotency_key, target="case-result")
    sealing.record_outcome(claim, Confirmed(receipt_id="r1", binding=binding, result=RESULT))
    sealing.record_evidence(
        op_id,
        source="lookup",
        verdict="confirmed",
        binding=binding,
        detail={"result": {**RESULT, "amount": 1}},
    )
    stored = raw_results(database_url, op_id)
    assert len(stored) == 3 and all('"key_id": "k1"' in s for s in stored), stored
    assert not [s for s in stored if "Quinlan" in s or "T-9931" in s], stored

    history = sealing.history(op_id)
    assert history.attempts[0].response is not None
    assert history.attempts[0].response["result"] == RESULT
    assert [e.detail["result"] for e in history.evidence] == [RESULT, {**RESULT, "amount": 1}]
    # without the key, the record still reads: the result says why it cannot be shown
    unkeyed = ledger.history(op_id).evidence[0].detail["result"]
    assert unkeyed == {
        "unreadable": "encrypted under key 'k1', which OPLEDGER_PAYLOAD_KEYS does not list"
    }

    rotated = opledger(database_url, "payloads", "rotate", keys=f"{K2},{K1}")
    assert rotated.returncode == 0, rotated.stderr
    assert "under key k2; 0 remain" in rotated.stdout, rotated.stdout
    assert all('"key_id": "k2"' in s for s in raw_results(database_url, op_id))
    only_new = ledgers(K2)  # the old key gone
    assert only_new.history(op_id).evidence[-1].detail["result"] == {**RESULT, "amount": 1}
