"""The SMTP adapter's Sent-folder search, against Debian's postfix and dovecot on loopback.

Postfix files a copy of each message from `SENDER` in the mailbox user's Sent folder (as a
hosted mailbox does for what was submitted); the fault proxy in front of postfix loses
the 250 after DATA. The ledger is the real one; the worker's steps run in this process.
Every test counts the copies in the mailboxes: the message went out exactly once.
"""

from __future__ import annotations

import smtplib
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from email.message import EmailMessage

import pytest

from opledger.adapters.defaults import build_registry
from opledger.adapters.imap import DIGEST_HEADER, SentFolder
from opledger.adapters.registry import Registry
from opledger.adapters.smtp import SmtpAdapter, message_id_for, smtp_contract
from opledger.dev.faultproxy import FaultProxy
from opledger.ledger import Ledger, Status
from opledger.ledger.decide import AskProvider, Confirm, HoldUnknown, NeedsReview, Wait
from opledger.ledger.models import EvidenceSource, Verdict
from opledger.settings import Settings
from opledger.tasks import steps
from tests.intents import prepare, smtp_mail
from tests.mailservers import RECIPIENT, SENDER, UNRECORDED_SENDER, MailServers, mailservers

TIMEOUT = timedelta(seconds=2)
IN_FLIGHT = timedelta(seconds=3)
LAG = timedelta(seconds=1)
LEASE = timedelta(seconds=10)
END_OF_DATA = b"\r\n.\r\n"


@pytest.fixture(scope="module")
def mail() -> Iterator[MailServers]:
    with mailservers() as servers:
        yield servers


class Rig:
    """A ledger whose only adapter is SMTP through `port`, searching `sent`."""

    def __init__(self, ledger: Ledger, port: int, sent: SentFolder, sender: str = SENDER) -> None:
        contract = smtp_contract(
            request_timeout=TIMEOUT,
            max_in_flight=IN_FLIGHT,
            sent_search_lag=LAG,
            lookup_interval=timedelta(seconds=0.2),
        )
        self.adapter = SmtpAdapter("127.0.0.1", port, sender=sender, contract=contract, sent=sent)
        self.registry = Registry([self.adapter])
        self.ledger = Ledger(ledger.engine, actions=self.registry)

    def dispatch(self, op_id: str) -> steps.StepResult:
        return steps.dispatch(self.ledger, self.registry, op_id, owner="w1", lease=LEASE)

    def reconcile(self, op_id: str) -> steps.StepResult:
        return steps.reconcile(self.ledger, self.registry, op_id, owner="w2", lease=LEASE)

    def lookups(self, op_id: str) -> list[dict[str, object]]:
        history = self.ledger.history(op_id)
        return [e.detail for e in history.evidence if e.source == EvidenceSource.LOOKUP]

    def sleep_past_deadline(self, op_id: str, extra: timedelta = timedelta(0)) -> None:
        deadline = max(a.deadline_at for a in self.ledger.history(op_id).attempts) + extra
        time.sleep(max(0.0, (deadline - datetime.now(deadline.tzinfo)).total_seconds()) + 0.05)


def imap_logins(mail: MailServers) -> int:
    """Logins dovecot logged for the Sent folder's user (the tests' own counts included)."""
    return mail.log("dovecot").count("Login: user=<opledger>")


def _cut_send(rig: Rig, proxy: FaultProxy, key: str) -> tuple[str, str]:
    op_id = prepare(rig.ledger, key, **smtp_mail("welcome", f"hello {key}"))
    proxy.cut_response(after=END_OF_DATA, times=1)
    result = rig.dispatch(op_id)
    assert result.operation is not None and result.operation.status is Status.UNKNOWN
    (evidence,) = rig.ledger.history(op_id).evidence
    assert evidence.detail["code"] == "connection_lost"
    assert proxy.fired["cut"] == 1
    return op_id, message_id_for(rig.ledger.get(op_id))


def test_a_send_cut_after_data_is_confirmed_from_its_sent_copy(
    ledger: Ledger, grant: str, mail: MailServers
) -> None:
    with FaultProxy(("127.0.0.1", mail.smtp_port)) as proxy:
        rig = Rig(ledger, proxy.port, mail.sent_folder())
        op_id, message_id = _cut_send(rig, proxy, "cut")
        mail.wait_for_copies(message_id, 1)  # postfix took it: the copy is filed

        # the send may still be in flight: no lookup, though the copy is there to find
        logins = imap_logins(mail)
        early = rig.reconcile(op_id)
        assert isinstance(early.decision, Wait)
        assert rig.lookups(op_id) == []

        # past the in-flight deadline, still inside the declared search lag: no lookup yet
        rig.sleep_past_deadline(op_id)
        held = rig.reconcile(op_id)
        assert isinstance(held.decision, HoldUnknown) and "search" in held.decision.reason
        assert rig.lookups(op_id) == []
        time.sleep(0.5)  # dovecot's log is written by another process
        assert imap_logins(mail) == logins

        rig.sleep_past_deadline(op_id, LAG)
        done = rig.reconcile(op_id)
        assert isinstance(done.decision, Confirm)
        op = rig.ledger.get(op_id)
        assert op.status is Status.CONFIRMED and op.provider_result_id == message_id
        (lookup,) = rig.lookups(op_id)
        assert lookup["accepted_only"] is True and lookup["hits"] == 1
        assert lookup["folder"] == "Sent" and lookup["message_id"] == message_id
        assert lookup["server"] == f"127.0.0.1:{mail.imap_port}"
        assert "custody, not delivery" in str(lookup["summary"])
        applied = [e for e in rig.ledger.history(op_id).evidence if e.applied]
        assert applied[-1].source == EvidenceSource.LOOKUP
        assert applied[-1].binding.payload_digest == op.payload_digest  # our body, not only id
        assert applied[-1].detail["result"] == {"message_id": message_id}
        assert proxy.connections == 1  # never sent again

    assert mail.copies(message_id) == 1
    assert mail.copies(message_id, user="owner", folder="INBOX") == 1
    deadline = time.monotonic() + 5
    while imap_logins(mail) < logins + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert imap_logins(mail) >= logins + 1  # the one lookup did log in


def test_a_cut_send_with_no_sent_copy_is_held_for_a_person_after_the_lag(
    ledger: Ledger, grant: str, mail: MailServers
) -> None:
    """The provider files no copy of this sender's mail: the message reached the recipient,
    but nothing we can read says so. After the lag, a person decides, told what was
    searched, where and when."""
    with FaultProxy(("127.0.0.1", mail.smtp_port)) as proxy:
        rig = Rig(ledger, proxy.port, mail.sent_folder(), sender=UNRECORDED_SENDER)
        op_id, message_id = _cut_send(rig, proxy, "uncopied")
        mail.wait_for_copies(message_id, 1, user="owner", folder="INBOX")

        rig.sleep_past_deadline(op_id)
        held = rig.reconcile(op_id)
        assert isinstance(held.decision, HoldUnknown)  # absence inside the lag proves nothing
        assert rig.lookups(op_id) == []

        rig.sleep_past_deadline(op_id, LAG)
        result = rig.reconcile(op_id)
        assert isinstance(result.decision, NeedsReview)
        assert proxy.connections == 1  # not sent again

    history = rig.ledger.history(op_id)
    assert history.operation.status is Status.UNKNOWN
    (lookup,) = rig.lookups(op_id)
    assert lookup["hits"] == 0 and lookup["folder"] == "Sent"
    assert lookup["message_id"] == message_id and lookup["searched_at"]
    summary = str(lookup["summary"])
    assert "not found" in summary and message_id in summary
    assert f"127.0.0.1:{mail.imap_port}" in summary and str(lookup["searched_at"]) in summary
    (review,) = history.reviews
    hint = str(review.snapshot["search_hint"])
    assert "'Sent'" in hint and message_id in hint and f"127.0.0.1:{mail.imap_port}" in hint
    shown = [e for e in review.snapshot["evidence"] if e["source"] == "lookup"]
    assert [e["detail"]["summary"] for e in shown] == [summary]
    assert review.snapshot["contract"]["lookup"]["kind"] == "search"

    assert mail.copies(message_id) == 0
    assert mail.copies(message_id, user="owner", folder="INBOX") == 1


def test_a_normal_send_is_confirmed_from_its_250_and_its_copy_binds_the_body(
    ledger: Ledger, grant: str, mail: MailServers
) -> None:
    rig = Rig(ledger, mail.smtp_port, mail.sent_folder())
    op_id = prepare(rig.ledger, "plain", **smtp_mail("receipt", "thanks"))
    result = rig.dispatch(op_id)
    op = rig.ledger.get(op_id)
    assert result.operation is not None and op.status is Status.CONFIRMED
    (evidence,) = rig.ledger.history(op_id).evidence
    assert evidence.source == EvidenceSource.DISPATCH and evidence.detail["accepted_only"]
    assert evidence.detail["result"] == {"message_id": message_id_for(op)}
    assert rig.lookups(op_id) == []
    message_id = message_id_for(op)
    mail.wait_for_copies(message_id, 1)
    assert mail.copies(message_id) == 1

    # both TLS modes read the same copy, and it carries this operation's payload digest
    for tls in ("starttls", "imaps"):
        (copy,) = mail.sent_folder(tls=tls).search(message_id)
        assert copy.digest == op.payload_digest and copy.to == RECIPIENT
    flags = mail.flags(message_id)  # read with EXAMINE and BODY.PEEK: never marked seen
    assert "FLAGS (" in flags and "Seen" not in flags

    # the settings wire the same search into the bundled SMTP adapter
    settings = Settings.from_environ(
        {
            "OPLEDGER_SMTP_HOST": "127.0.0.1",
            "OPLEDGER_SMTP_PORT": str(mail.smtp_port),
            "OPLEDGER_SMTP_SENT_IMAP_HOST": "127.0.0.1",
            "OPLEDGER_SMTP_SENT_IMAP_PORT": str(mail.imaps_port),
            "OPLEDGER_SMTP_SENT_IMAP_USER": mail.user,
            "OPLEDGER_SMTP_SENT_IMAP_PASSWORD": mail.password,
            "OPLEDGER_SMTP_SENT_IMAP_CAFILE": mail.cafile,
            "OPLEDGER_SMTP_SENT_SEARCH_LAG_SECONDS": "7",
        }
    )
    adapter = build_registry(settings).adapter_for("email.smtp_send.v1")
    assert adapter.contract.lookup.kind == "search"
    assert adapter.contract.lookup.lag == timedelta(seconds=7)
    found = adapter.lookup(op, [])
    assert found.verdict == Verdict.CONFIRMED and found.detail["tls"] == "imaps"
    assert found.binding.payload_digest == op.payload_digest
    assert mail.password not in repr(settings) and mail.password not in str(found.detail)


def test_a_copy_of_another_body_under_our_message_id_confirms_nothing(
    ledger: Ledger, grant: str, mail: MailServers
) -> None:
    rig = Rig(ledger, mail.smtp_port, mail.sent_folder())
    op = rig.ledger.get(prepare(rig.ledger, "forged", **smtp_mail()))
    message_id = message_id_for(op)
    forged = EmailMessage()
    forged["From"], forged["To"], forged["Subject"] = SENDER, RECIPIENT, "not ours"
    forged["Message-ID"] = message_id
    forged[DIGEST_HEADER] = "0" * 64
    forged.set_content("another body")
    with smtplib.SMTP("127.0.0.1", mail.smtp_port, timeout=10) as smtp:
        smtp.send_message(forged)
    mail.wait_for_copies(message_id, 1)
    result = rig.adapter.lookup(op, [])
    assert result.verdict == Verdict.INCONCLUSIVE and result.detail["hits"] == 1
    assert "payload digest" in str(result.detail["summary"])


def test_a_failed_imap_read_is_inconclusive_with_the_error(
    ledger: Ledger, grant: str, mail: MailServers
) -> None:
    op = ledger.get(prepare(ledger, "unread", **smtp_mail()))
    wrong = SentFolder(
        host="127.0.0.1",
        port=mail.imap_port,
        user=mail.user,
        password="not-the-password",
        tls="starttls",
        cafile=mail.cafile,
    )
    failures = {
        "login": wrong,
        "folder": mail.sent_folder(folder="No Such Folder"),
        "certificate": SentFolder(  # verified against the system's CAs: ours is not one
            host="127.0.0.1", port=mail.imaps_port, user=mail.user, password=mail.password
        ),
        "connection": SentFolder(
            host="127.0.0.1", port=9, user=mail.user, password=mail.password, tls="none"
        ),
    }
    for what, sent in failures.items():
        adapter = SmtpAdapter(
            "127.0.0.1",
            mail.smtp_port,
            contract=smtp_contract(sent_search_lag=LAG),
            sent=sent,
        )
        result = adapter.lookup(op, [])
        assert result.verdict == Verdict.INCONCLUSIVE, what
        assert result.detail["error"] and "could not search" in str(result.detail["summary"]), what
        assert mail.password not in str(result.detail) and "not-the-password" not in str(
            result.detail
        )
    # and an existing, empty folder is absence, which proves nothing
    empty = SmtpAdapter(
        "127.0.0.1",
        mail.smtp_port,
        contract=smtp_contract(sent_search_lag=LAG),
        sent=mail.sent_folder(folder="Archive"),
    ).lookup(op, [])
    assert empty.verdict == Verdict.INCONCLUSIVE and empty.detail["hits"] == 0
    assert "error" not in empty.detail


def test_without_a_sent_folder_the_contract_is_as_before() -> None:
    plain = smtp_contract()
    assert plain == smtp_contract(sent_search_lag=None)
    # what it always was: no deduplication, no lookup, RFC 5321's bound, custody only
    assert plain.lookup.kind == "none" and plain.idempotency.kind == "none"
    assert plain.max_in_flight == timedelta(minutes=10) and plain.success_proves == "accepted"
    assert plain.source == (
        "RFC 5321 §4.1.1.4, §4.5.3.2.6 (250 after DATA is custody; 10-minute DATA timeout)"
    )
    adapter = build_registry(Settings.from_environ({})).adapter_for("email.smtp_send.v1")
    assert adapter.contract == smtp_contract(request_timeout=timedelta(seconds=10))
    with pytest.raises(ValueError, match="search lookup"):
        SmtpAdapter("127.0.0.1", 25, contract=smtp_contract(sent_search_lag=LAG))


def test_no_lookup_while_a_send_may_be_in_flight_even_with_a_copy_to_find(
    ledger: Ledger, grant: str, mail: MailServers
) -> None:
    """Rule 3 holds for a search: the in-flight bound, not the copy, says when to look."""
    with FaultProxy(("127.0.0.1", mail.smtp_port)) as proxy:
        rig = Rig(ledger, proxy.port, mail.sent_folder())
        op_id, message_id = _cut_send(rig, proxy, "in-flight")
        mail.wait_for_copies(message_id, 1)
        for _ in range(3):
            decided = rig.reconcile(op_id)
            assert isinstance(decided.decision, Wait), decided.decision
            assert not isinstance(decided.decision, AskProvider)
        assert rig.lookups(op_id) == []
        assert rig.ledger.get(op_id).status is Status.UNKNOWN


def test_opledger_check_reads_the_sent_folder_and_only_warns_when_it_cannot(
    mail: MailServers,
) -> None:
    from opledger.cli.checks import failures, run_checks

    env = {
        "OPLEDGER_SMTP_SENT_IMAP_HOST": "127.0.0.1",
        "OPLEDGER_SMTP_SENT_IMAP_PORT": str(mail.imaps_port),
        "OPLEDGER_SMTP_SENT_IMAP_USER": mail.user,
        "OPLEDGER_SMTP_SENT_IMAP_PASSWORD": mail.password,
        "OPLEDGER_SMTP_SENT_IMAP_CAFILE": mail.cafile,
    }

    def sent_check(environ: dict[str, str]) -> tuple[str, bool, bool, bool]:
        checks = run_checks(environ, broker=True, database=False)
        (check,) = [c for c in checks if c.name == "smtp sent folder"]
        return check.line(), check.ok, check.warning, check in failures(checks)

    line, ok, _, failed = sent_check(env)
    assert ok and not failed and "'Sent'" in line and "readable" in line
    line, ok, warning, failed = sent_check({**env, "OPLEDGER_SMTP_SENT_IMAP_PASSWORD": "wrong"})
    assert not ok and warning and not failed and "goes to a person" in line
    assert mail.password not in line
    line, ok, warning, _ = sent_check({**env, "OPLEDGER_SMTP_SENT_FOLDER": "Nope"})
    assert not ok and warning and "'Nope'" in line
