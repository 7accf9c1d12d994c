"""The send-by window: a claim is good for starting a request only until its send-by
instant, checked at the wire after the connection is set up, and an attempt that sent
nothing is recorded as exactly that."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any, Literal

import pytest
from sqlalchemy import text

from opledger.adapters.base import LookupResult, sending
from opledger.adapters.crm import CrmAdapter, crm_contract
from opledger.adapters.registry import Registry
from opledger.adapters.smtp import SmtpAdapter, message_id_for, smtp_contract
from opledger.dev.sandbox import Sandbox
from opledger.ledger import (
    Ambiguous,
    Attempt,
    Claim,
    ClaimTerms,
    Confirmed,
    Ledger,
    Operation,
    Outcome,
    SendWindowPassed,
    StaleFence,
    Status,
)
from opledger.ledger.decide import Dispatch, ReviewPolicy
from opledger.ledger.evidence import NOT_SENT
from opledger.tasks import steps
from opledger.tasks.worker import FollowUp, FollowUps, Worker
from tests.intents import key_of, prepare, smtp_mail

LEASE = timedelta(seconds=30)


def _send(desk: CrmDesk, adapter: Any, claim: Claim, **follow: FollowUp) -> steps.StepResult:
    """The worker's provider call and its recording, under `claim`."""
    worker = Worker(desk.ledger, desk.registry, owner=claim.owner, follow_ups=FollowUps(**follow))
    return worker.send(adapter, claim)


def not_sent(attempt: Attempt) -> bool:
    """The attempt was recorded as not sent because its send-by window had passed."""
    response = attempt.response or {}
    return (
        attempt.outcome == "ambiguous"
        and response.get("code") == NOT_SENT
        and response.get("detail", {}).get("why") == "window_passed"
    )


def _claim(ledger: Ledger, op_id: str, window: float, *, retry: bool = False) -> Claim:
    terms = ClaimTerms(
        lease=LEASE, in_flight=timedelta(seconds=2), send_window=timedelta(seconds=window)
    )
    if retry:
        fence = ledger.get(op_id).fence
        claim = ledger.claim_retry(op_id, owner="w1", expected_fence=fence, terms=terms)
    else:
        claim = ledger.claim(op_id, owner="w1", terms=terms)
    assert claim is not None
    return claim


class CrmDesk:
    def __init__(
        self,
        ledger: Ledger,
        url: str,
        *,
        keys: bool = True,
        lookup: Literal["status_api", "search", "none"] = "none",
    ) -> None:
        contract = crm_contract(
            keys=keys,
            lookup=lookup,
            request_timeout=timedelta(seconds=1),
            max_in_flight=timedelta(seconds=1),
        )
        self.adapter = CrmAdapter(url, account="acme", contract=contract)
        self.registry = Registry([self.adapter])
        self.ledger = Ledger(ledger.engine, actions=self.registry)


@pytest.fixture
def crm(ledger: Ledger, grant: str, sandbox: Sandbox) -> Iterator[CrmDesk]:
    desk = CrmDesk(ledger, sandbox.http_url)
    yield desk
    desk.adapter.close()


def test_the_claim_returns_database_time_and_send_by_and_the_deadline_covers_both(
    ledger: Ledger, grant: str
) -> None:
    op_id = prepare(ledger, "times")
    claim = _claim(ledger, op_id, 1.5)
    assert claim.send_by is not None and claim.db_now is not None
    assert claim.send_by - claim.db_now == timedelta(seconds=1.5)
    assert claim.started_at == claim.db_now
    assert claim.deadline_at == claim.send_by + timedelta(seconds=2)
    assert 0 < claim.window.remaining() <= 1.5
    (attempt,) = ledger.history(op_id).attempts
    assert attempt.send_by == claim.send_by and attempt.deadline_at == claim.deadline_at
    assert "window" not in claim.model_dump()  # a process-local clock, never serialized


def test_the_registry_sizes_each_providers_window_from_its_request_timeout(
    crm: CrmDesk,
) -> None:
    op_id = prepare(crm.ledger, "sized")
    claim = crm.ledger.claim(op_id, owner="w1", terms=crm.registry.claim_terms(LEASE))
    assert claim is not None
    assert claim.send_by is not None and claim.db_now is not None
    assert claim.send_by - claim.db_now == timedelta(seconds=1)  # the request timeout
    assert claim.deadline_at - claim.send_by == timedelta(seconds=1)  # max in flight


def test_a_check_after_the_window_refuses_and_remembers(ledger: Ledger, grant: str) -> None:
    op_id = prepare(ledger, "refuse")
    claim = _claim(ledger, op_id, 0.2)
    claim.window.check()  # in time
    assert not claim.window.refused
    time.sleep(0.3)
    with pytest.raises(SendWindowPassed, match="nothing was sent"):
        claim.window.check()
    assert claim.window.refused


class SilentServer:
    """A TCP server that accepts connections and records every byte it receives."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.accepted = 0
        self.received = b""
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.settimeout(2)
                while True:
                    try:
                        chunk = conn.recv(65536)
                    except OSError:
                        break
                    if not chunk:
                        break
                    self.received += chunk

    def close(self) -> None:
        self.sock.close()


def test_the_http_check_runs_after_the_connection_is_set_up_and_before_any_byte(
    ledger: Ledger, grant: str
) -> None:
    server = SilentServer()
    desk = CrmDesk(ledger, server.url)
    try:
        op_id = prepare(desk.ledger, "wire")
        claim = _claim(desk.ledger, op_id, 0.05)
        time.sleep(0.1)
        with sending(claim.window):
            outcome = desk.adapter.dispatch(claim)
        time.sleep(0.3)
        assert claim.window.refused
        assert isinstance(outcome, Ambiguous) and outcome.code == NOT_SENT
        assert server.accepted == 1  # the connection was set up ...
        assert server.received == b""  # ... and not one byte of the request left
    finally:
        desk.adapter.close()
        server.close()


def test_outside_a_claim_the_shared_client_does_not_check(crm: CrmDesk, sandbox: Sandbox) -> None:
    op_id = prepare(crm.ledger, "lookup")
    # a lookup is a read: no window armed, so no check
    assert crm.adapter.lookup(crm.ledger.get(op_id), ()).verdict == "inconclusive"


def test_a_late_worker_records_not_sent_and_the_provider_sees_nothing(
    crm: CrmDesk, sandbox: Sandbox
) -> None:
    op_id = prepare(crm.ledger, "late")
    claim = _claim(crm.ledger, op_id, 0.1)
    time.sleep(0.2)  # frozen between the claim and the send
    result = _send(crm, crm.adapter, claim)
    assert result.action == "dispatched"
    assert claim.idempotency_key == key_of(crm.ledger, op_id)
    assert sandbox.truth()["requests"].get(f"crm:{claim.idempotency_key}") is None
    history = crm.ledger.history(op_id)
    (attempt,) = history.attempts
    assert not_sent(attempt)
    (ev,) = history.evidence
    assert (ev.source, ev.detail["code"], ev.attempt_n) == ("dispatch", NOT_SENT, 1)
    assert history.operation.status is Status.UNKNOWN
    assert history.operation.next_check_at is not None


def test_the_wire_check_inside_the_adapter_is_recorded_as_not_sent(
    crm: CrmDesk, sandbox: Sandbox
) -> None:
    """The window passes between the worker's own check and the connection: the shared
    HTTP client refuses at the wire and the worker records not sent, whatever the adapter
    returned."""

    class Slow:
        contract = crm.adapter.contract
        actions = crm.adapter.actions

        def dispatch(self, claim: Claim) -> Outcome:
            time.sleep(0.25)  # a pause inside the adapter, before the request
            return crm.adapter.dispatch(claim)

        def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
            raise AssertionError

    op_id = prepare(crm.ledger, "inside")
    claim = _claim(crm.ledger, op_id, 0.15)
    _send(crm, Slow(), claim)
    assert claim.idempotency_key == key_of(crm.ledger, op_id)
    assert sandbox.truth()["requests"].get(f"crm:{claim.idempotency_key}") is None
    assert not_sent(crm.ledger.history(op_id).attempts[0])


def test_smtp_checks_after_the_greeting_and_sends_nothing_late(
    ledger: Ledger, grant: str, sandbox: Sandbox
) -> None:
    adapter = SmtpAdapter(sandbox.smtp_host, sandbox.smtp_port, contract=smtp_contract())
    op_id = prepare(ledger, "smtp", **smtp_mail())
    claim = _claim(ledger, op_id, 0.1)
    time.sleep(0.2)
    adapter.dispatch(claim)
    assert claim.window.refused
    assert sandbox.effects(f"smtp:{message_id_for(claim.operation)}") == 0
    in_time = _claim(ledger, prepare(ledger, "smtp2", **smtp_mail()), 5)
    assert isinstance(adapter.dispatch(in_time), Confirmed)
    assert sandbox.effects(f"smtp:{message_id_for(in_time.operation)}") == 1


@pytest.mark.parametrize("keys", [True, False], ids=["keyed", "no-dedup"])
def test_an_attempt_that_sent_nothing_is_not_in_flight_and_is_sent_again_at_once(
    ledger: Ledger, grant: str, sandbox: Sandbox, keys: bool
) -> None:
    desk = CrmDesk(ledger, sandbox.http_url, keys=keys)
    sandbox.configure(keys=keys)
    try:
        op_id = prepare(desk.ledger, "again")
        claim = _claim(desk.ledger, op_id, 0.1)
        time.sleep(0.2)
        _send(desk, desk.adapter, claim)
        deadline = desk.ledger.history(op_id).attempts[0].deadline_at
        result = steps.reconcile(desk.ledger, desk.registry, op_id, owner="w2", lease=LEASE)
        assert isinstance(result.decision, Dispatch)  # no wait for the deadline, no review
        assert result.operation is not None and result.operation.status is Status.CONFIRMED
        history = desk.ledger.history(op_id)
        assert history.attempts[1].started_at < deadline
        assert sandbox.effects(f"crm:{history.operation.idempotency_key}") == 1
    finally:
        desk.adapter.close()


def test_claims_that_keep_missing_the_window_end_in_review(crm: CrmDesk) -> None:
    op_id = prepare(crm.ledger, "always-late")
    policy = ReviewPolicy(after_attempts=2)
    claim = _claim(crm.ledger, op_id, 0.05)
    time.sleep(0.1)
    _send(crm, crm.adapter, claim)
    claim = _claim(crm.ledger, op_id, 0.05, retry=True)
    time.sleep(0.1)
    _send(crm, crm.adapter, claim)
    result = steps.reconcile(
        crm.ledger, crm.registry, op_id, owner="w2", lease=LEASE, policy=policy
    )
    assert result.action == "review"
    assert "none of which reached the provider" in crm.ledger.history(op_id).reviews[0].reason


def _fence_out(ledger: Ledger, op_id: str) -> None:
    """What the sweeper does to an expired lease: unknown, fence + 1."""
    with ledger.engine.begin() as conn:
        conn.execute(
            text("UPDATE operations SET lease_expires_at = now() - interval '1 s' WHERE id = :id"),
            {"id": op_id},
        )
    assert ledger.expire_leases() == [op_id]


def test_a_fenced_out_workers_kept_outcome_bumps_the_version_and_settles_at_once(
    crm: CrmDesk, sandbox: Sandbox
) -> None:
    op_id = prepare(crm.ledger, "slow-call")
    claim = _claim(crm.ledger, op_id, 5)
    _fence_out(crm.ledger, op_id)  # the call outlived the lease
    before = crm.ledger.get(op_id).record_version
    settled: list[str] = []
    result = _send(crm, crm.adapter, claim, reconcile=settled.append)
    assert result.action == "fenced"
    assert settled == [op_id]  # reconcile now, not at the next scheduled check
    after = crm.ledger.get(op_id)
    assert after.status is Status.UNKNOWN and after.record_version == before + 1
    # and reconciling it confirms it from the kept receipt
    result = steps.reconcile(crm.ledger, crm.registry, op_id, owner="w2", lease=LEASE)
    assert result.action == "confirmed"
    assert sandbox.effects(f"crm:{claim.idempotency_key}") == 1


def test_no_settle_when_the_fenced_out_outcome_lands_on_a_newer_claim(
    crm: CrmDesk, sandbox: Sandbox
) -> None:
    op_id = prepare(crm.ledger, "newer")
    claim = _claim(crm.ledger, op_id, 5)
    _fence_out(crm.ledger, op_id)
    assert _claim(crm.ledger, op_id, 5, retry=True) is not None  # another worker holds it
    with pytest.raises(StaleFence) as info:
        crm.ledger.record_outcome(claim, Ambiguous(code=NOT_SENT, reason="test"))
    # kept, but the operation is another worker's now: nothing to settle
    assert info.value.fields["evidence_kept"] and info.value.fields["status"] == "dispatching"
