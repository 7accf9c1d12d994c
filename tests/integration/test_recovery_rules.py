"""The retry rules end to end: ledger + adapter + decision against a real sandbox provider.

Each test breaks one request, then lets the worker steps reconcile, and asserts on the
provider's own ground truth (effects and requests per key) as well as on the ledger.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from opledger.adapters.crm import CrmAdapter, crm_contract
from opledger.adapters.registry import Registry
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ambiguous, Ledger, Status
from opledger.ledger.contract import Contract
from opledger.ledger.decide import Dispatch, NeedsReview, ReviewPolicy
from opledger.tasks import steps
from tests.desks import not_before, past_deadlines
from tests.intents import Change, key_of, prepare, smtp_mail

TIMEOUT = timedelta(seconds=0.5)
IN_FLIGHT = timedelta(seconds=1)
LEASE = timedelta(seconds=5)


class Rig:
    def __init__(self, ledger: Ledger, sandbox: Sandbox, contract: Contract) -> None:
        self.sandbox = sandbox
        self.adapter = CrmAdapter(sandbox.http_url, account="acme", contract=contract)
        self.registry = Registry([self.adapter])
        self.ledger = Ledger(ledger.engine, actions=self.registry)
        self.ledger.grant(tenant="acme", scope=["crm.*"], granted_by="t", ref="auth_acme")

    def dispatch(self, op_id: str) -> steps.StepResult:
        return steps.dispatch(self.ledger, self.registry, op_id, owner="w1", lease=LEASE)

    def reconcile(
        self,
        op_id: str,
        policy: ReviewPolicy | None = None,
        now: Callable[[], datetime] = steps.utcnow,
    ) -> steps.StepResult:
        return steps.reconcile(
            self.ledger,
            self.registry,
            op_id,
            owner="w2",
            lease=LEASE,
            now=now,
            policy=policy or ReviewPolicy(),
        )

    def past_deadline(self, op_id: str, policy: ReviewPolicy | None = None) -> steps.StepResult:
        """Reconcile on a clock past the attempts' in-flight deadlines, where nothing else
        of the test needs that time to have passed (no lookup, nothing timed at the
        provider)."""
        return self.reconcile(op_id, policy, now=past_deadlines(self.ledger, op_id))

    def after_deadline(self, op_id: str, extra: float = 0.05) -> None:
        """Wait, in real time, until the attempts' in-flight deadlines have passed: for a
        test whose lookups must be recorded after them, or whose provider records when a
        retry arrived."""
        deadline = max(a.deadline_at for a in self.ledger.history(op_id).attempts)
        time.sleep(max(0.0, (deadline - datetime.now(deadline.tzinfo)).total_seconds()) + extra)

    def requests(self, op_id: str) -> list[dict[str, Any]]:
        """Every request the CRM admitted under the operation's key."""
        key = key_of(self.ledger, op_id)
        return list(self.sandbox.truth()["requests"].get(f"crm:{key}", []))

    def effects(self, op_id: str) -> int:
        """How many times the CRM applied the operation's key."""
        return self.sandbox.effects(f"crm:{key_of(self.ledger, op_id)}")


#: the fixture `rig_for`: a rig on a CRM contract built from these keyword arguments
RigFor = Callable[..., Rig]


@pytest.fixture
def rig_for(ledger: Ledger, sandbox: Sandbox) -> Iterator[RigFor]:
    rigs: list[Rig] = []

    def make(**contract: Any) -> Rig:
        rig = Rig(
            ledger,
            sandbox,
            crm_contract(
                request_timeout=TIMEOUT,
                max_in_flight=IN_FLIGHT,
                lookup_interval=timedelta(seconds=0.2),
                **contract,
            ),
        )
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.adapter.close()


def test_happy_path_and_redelivery(rig_for: RigFor) -> None:
    rig = rig_for()
    op_id = prepare(rig.ledger, "close")
    dispatched = rig.dispatch(op_id).operation
    assert dispatched is not None and dispatched.status is Status.CONFIRMED
    for _ in range(3):  # a redelivered message is a no-op
        assert rig.dispatch(op_id).action == "noop"
    assert rig.effects(op_id) == 1 and len(rig.requests(op_id)) == 1


def test_response_lost_inside_retention_retries_with_the_same_key(rig_for: RigFor) -> None:
    rig = rig_for(lookup="none", retention=timedelta(seconds=30), retention_margin=timedelta(0))
    rig.sandbox.fault("crm", "drop_after_commit")
    op_id = prepare(rig.ledger, "close")
    dispatched = rig.dispatch(op_id).operation
    assert dispatched is not None and dispatched.status is Status.UNKNOWN
    assert rig.reconcile(op_id).action == "waiting"  # the first call may still be in flight
    rig.after_deadline(op_id)
    result = rig.reconcile(op_id)
    assert isinstance(result.decision, Dispatch)
    assert rig.ledger.get(op_id).status is Status.CONFIRMED
    _first, second = rig.requests(op_id)
    deadline = rig.ledger.history(op_id).attempts[0].deadline_at.timestamp()
    assert second["arrived"] >= deadline
    assert rig.effects(op_id) == 1


def test_key_past_retention_goes_to_review(rig_for: RigFor) -> None:
    rig = rig_for(
        lookup="none", retention=timedelta(seconds=2), retention_margin=timedelta(seconds=0.5)
    )
    rig.sandbox.configure(retention_s=2.0)
    rig.sandbox.fault("crm", "drop_after_commit")
    op_id = prepare(rig.ledger, "close")
    rig.dispatch(op_id)
    # the decision alone measures the retention here (nothing is sent again): on its clock
    (first,) = rig.ledger.history(op_id).attempts
    result = rig.reconcile(op_id, now=not_before(first.started_at + timedelta(seconds=2)))
    assert isinstance(result.decision, NeedsReview) and "keeps keys" in result.decision.reason
    history = rig.ledger.history(op_id)
    assert history.operation.status is Status.UNKNOWN
    assert [r.reason for r in history.reviews] == [result.decision.reason]
    assert rig.effects(op_id) == 1 and len(rig.requests(op_id)) == 1


def test_a_replayed_stored_500_is_not_retried_in_a_loop(rig_for: RigFor) -> None:
    # the contract (wrongly) says a failure leaves nothing applied and the key free; the
    # provider replays its stored error anyway
    rig = rig_for(lookup="none")
    rig.adapter.contract = rig.adapter.contract.model_copy(
        update={
            "idempotency": rig.adapter.contract.idempotency.model_copy(
                update={"after_error": "nothing_applied"}
            )
        }
    )
    rig.sandbox.fault("crm", "error_before_commit")
    op_id = prepare(rig.ledger, "close")
    rig.dispatch(op_id)
    assert isinstance(rig.past_deadline(op_id).decision, Dispatch)  # one retry, the same key
    for _ in range(3):
        assert isinstance(rig.past_deadline(op_id).decision, NeedsReview)
    history = rig.ledger.history(op_id)
    assert history.evidence[-1].detail["replayed"] is True
    assert len(history.reviews) == 1
    assert len(rig.requests(op_id)) == 2 and rig.effects(op_id) == 0


def test_a_provider_that_declares_stored_errors_is_not_retried_at_all(rig_for: RigFor) -> None:
    rig = rig_for(lookup="none")
    rig.sandbox.fault("crm", "error_before_commit")
    op_id = prepare(rig.ledger, "close")
    rig.dispatch(op_id)
    assert isinstance(rig.past_deadline(op_id).decision, NeedsReview)
    assert len(rig.requests(op_id)) == 1


def test_search_lag_keeps_it_unknown_and_a_person_decides(rig_for: RigFor) -> None:
    rig = rig_for(keys=False, lookup="search", search_lag=timedelta(seconds=0.5))
    rig.sandbox.configure(keys=False, search_lag_s=30.0)  # slower than the contract says
    rig.sandbox.fault("crm", "drop_after_commit")
    op_id = prepare(rig.ledger, "close")
    rig.dispatch(op_id)
    assert rig.reconcile(op_id).action == "waiting"
    rig.after_deadline(op_id, extra=0.6)
    result = rig.reconcile(op_id)
    assert isinstance(result.decision, NeedsReview)
    history = rig.ledger.history(op_id)
    assert history.operation.status is Status.UNKNOWN
    assert [e.verdict for e in history.evidence if e.source == "lookup"] == ["inconclusive"]
    assert rig.effects(op_id) == 1 and len(rig.requests(op_id)) == 1


def test_status_api_no_such_request_after_the_deadline_allows_a_safe_retry(rig_for: RigFor) -> None:
    rig = rig_for()
    rig.sandbox.configure(replay_errors=False)  # the failed request leaves no trace of the key
    rig.sandbox.fault("crm", "error_before_commit")
    op_id = prepare(rig.ledger, "close")
    rig.dispatch(op_id)
    early = rig.reconcile(op_id)  # in flight: looks, learns "absent", but may not retry yet
    assert early.action == "waiting"
    assert len(rig.requests(op_id)) == 1
    rig.after_deadline(op_id)
    result = rig.reconcile(op_id)
    key = key_of(rig.ledger, op_id)
    assert key.startswith("opk_")
    assert isinstance(result.decision, Dispatch) and result.decision.idempotency_key == key
    assert rig.ledger.get(op_id).status is Status.CONFIRMED
    _first, second = rig.requests(op_id)
    assert second["arrived"] >= rig.ledger.history(op_id).attempts[0].deadline_at.timestamp()
    assert rig.effects(op_id) == 1


def test_a_case_closed_by_someone_else_is_not_confirmed(rig_for: RigFor) -> None:
    rig = rig_for(keys=False, lookup="search", search_lag=timedelta(seconds=0.1))
    rig.sandbox.configure(keys=False)
    rig.sandbox.fault("crm", "error_before_commit")
    op_id = prepare(rig.ledger, "close", target="case-9")
    rig.dispatch(op_id)
    rig.sandbox.close_by_other("acme", "case-9")
    rig.after_deadline(op_id, extra=0.2)
    result = rig.reconcile(op_id)
    assert isinstance(result.decision, NeedsReview)
    assert rig.ledger.get(op_id).status is Status.UNKNOWN
    assert rig.effects(op_id) == 0


def test_an_unknown_action_is_refused_at_prepare(rig_for: RigFor) -> None:
    from opledger.ledger import UnknownAction

    rig = rig_for()
    with pytest.raises(UnknownAction):
        prepare(rig.ledger, "k", action="crm.delete_case.v1")


def test_the_review_policy_caps_attempts_below_the_contract(rig_for: RigFor) -> None:
    rig = rig_for(lookup="none")
    rig.sandbox.fault("crm", "drop_after_commit")
    op_id = prepare(rig.ledger, "close")
    rig.dispatch(op_id)
    result = rig.past_deadline(op_id, ReviewPolicy(after_attempts=1))
    assert isinstance(result.decision, NeedsReview) and "1 attempts" in result.decision.reason
    assert len(rig.requests(op_id)) == 1


def test_the_review_policy_hands_over_an_operation_unknown_for_too_long(rig_for: RigFor) -> None:
    rig = rig_for()
    rig.sandbox.configure(processing_s=3.0)  # the provider keeps saying "in progress"
    op_id = prepare(rig.ledger, "close")
    rig.dispatch(op_id)  # times out after 0.5 s: unknown
    rig.after_deadline(op_id)
    waiting = rig.reconcile(op_id)
    assert waiting.action == "waiting"
    result = rig.reconcile(op_id, ReviewPolicy(after=timedelta(seconds=1)))
    assert isinstance(result.decision, NeedsReview) and "still unknown" in result.decision.reason
    assert len(rig.requests(op_id)) == 1


def test_an_smtp_review_names_the_message_id_and_a_refused_connection_is_resent(
    ledger: Ledger, sandbox: Sandbox
) -> None:
    from opledger.adapters.smtp import SmtpAdapter, message_id_for, smtp_contract

    # a send-by window a busy machine cannot outwait before the envelope (the deadlines
    # are passed by `now=`, never waited for)
    ten = timedelta(seconds=10)
    contract = smtp_contract(request_timeout=ten, max_in_flight=ten)
    down = SmtpAdapter("127.0.0.1", 9, contract=contract)  # nothing listens: refused
    up = SmtpAdapter(sandbox.smtp_host, sandbox.smtp_port, contract=contract)
    led = Ledger(ledger.engine, actions=Registry([up]))
    led.grant(tenant="acme", scope=["email.*"], granted_by="t", ref="auth_mail")

    welcome = smtp_mail("welcome", "hi") | Change(authorization_ref="auth_mail")

    # refused before anything was sent: no review, the next reconcile sends it
    refused = prepare(led, "refused", **welcome)
    steps.dispatch(led, Registry([down]), refused, owner="w1", lease=LEASE)
    assert led.history(refused).evidence[-1].detail["code"] == "not_sent"
    result = steps.reconcile(led, Registry([up]), refused, owner="w2", lease=LEASE)
    assert isinstance(result.decision, Dispatch)
    assert led.get(refused).status is Status.CONFIRMED
    assert sandbox.effects(f"smtp:{message_id_for(led.get(refused))}") == 1

    # cut after DATA: a person decides, told which Message-ID to search for
    cut = prepare(led, "cut", **welcome)
    sandbox.fault("smtp", "drop_after_data")
    steps.dispatch(led, Registry([up]), cut, owner="w1", lease=LEASE)
    past = past_deadlines(led, cut)
    result = steps.reconcile(led, Registry([up]), cut, owner="w2", lease=LEASE, now=past)
    assert isinstance(result.decision, NeedsReview)
    (review,) = led.history(cut).reviews
    message_id = message_id_for(led.get(cut))
    assert message_id in review.snapshot["search_hint"]
    assert led.history(cut).evidence[0].detail["message_id"] == message_id


def test_an_operation_whose_adapter_is_gone_is_held_and_resumed_by_a_worker_that_serves_it(
    rig_for: RigFor, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose configuration lacks the action's adapter (a rolling deploy, a mistyped
    action) sends nothing and asks nobody: the operation is held, checked again later with
    a bounded backoff, and a worker that serves the action sends it under the same key."""
    rig = rig_for()
    op_id = prepare(rig.ledger, "close")
    bare = Registry()  # a worker configured without the CRM adapter
    with caplog.at_level("WARNING", logger="opledger.worker"):
        result = steps.dispatch(rig.ledger, bare, op_id, owner="w1", lease=LEASE)
    assert result.action == "held"
    history = rig.ledger.history(op_id)
    assert history.operation.status is Status.UNKNOWN
    assert not history.reviews
    assert [a.outcome for a in history.attempts] == ["ambiguous"]
    assert history.attempts[0].response is not None
    assert history.attempts[0].response["code"] == "not_sent"
    assert (
        "no adapter of this worker serves crm.close_case.v1"
        in (history.attempts[0].response["reason"])
    )
    assert rig.effects(op_id) == 0 and rig.requests(op_id) == []
    # held, not dropped: checked again after the hold, not at once and not never
    next_check = history.operation.next_check_at
    assert next_check is not None
    wait = next_check - history.operation.updated_at
    assert steps.HOLD_MIN - timedelta(seconds=1) <= wait <= steps.HOLD_MAX
    assert rig.ledger.due_checks(backoff=timedelta(seconds=30)) == []
    warned = [r for r in caplog.records if op_id in r.getMessage()]
    assert len(warned) == 1 and "crm.close_case.v1" in warned[0].getMessage()

    # another worker of the old configuration takes the check: still held, nothing new
    caplog.clear()
    with caplog.at_level("WARNING", logger="opledger.worker"):
        again = steps.reconcile(rig.ledger, bare, op_id, owner="w2", lease=LEASE)
    assert again.action == "held"
    history = rig.ledger.history(op_id)
    assert len(history.attempts) == 1 and not history.reviews
    assert history.operation.next_check_at is not None
    assert [r for r in caplog.records if op_id in r.getMessage()] == []  # once per process

    # a worker that serves it: sent once, under the operation's one key
    resumed = rig.reconcile(op_id)
    assert isinstance(resumed.decision, Dispatch)
    history = rig.ledger.history(op_id)
    assert history.operation.status is Status.CONFIRMED
    assert not history.reviews
    assert rig.effects(op_id) == 1 and len(rig.requests(op_id)) == 1
    assert {a.idempotency_key for a in history.attempts} == {history.operation.idempotency_key}


def test_an_operation_held_longer_than_the_review_policy_goes_to_a_person_once(
    rig_for: RigFor,
) -> None:
    """No deploy takes the review policy's `after`: a person is asked (a mistyped action is
    never served, and nobody may have cancelled it), once."""
    rig = rig_for()
    op_id = prepare(rig.ledger, "close")
    bare = Registry()
    assert steps.dispatch(rig.ledger, bare, op_id, owner="w1", lease=LEASE).action == "held"
    asked: list[str] = []
    soon = ReviewPolicy(after=timedelta(milliseconds=1))
    time.sleep(0.01)
    for _ in range(2):
        result = steps.reconcile(
            rig.ledger, bare, op_id, owner="w2", lease=LEASE, policy=soon, on_review=asked.append
        )
        assert result.action == "review"
    (review,) = rig.ledger.history(op_id).reviews
    assert "no adapter has served crm.close_case.v1" in review.reason
    assert asked == [op_id]
    assert rig.effects(op_id) == 0 and rig.requests(op_id) == []


def test_a_held_operation_can_be_cancelled_and_one_that_may_have_applied_cannot(
    rig_for: RigFor,
) -> None:
    """Nothing of a held operation reached a provider: an operator cancels it at once (a
    mistyped action is never served). An unknown operation whose attempt may have reached
    the provider, or that a review holds, is refused: it is settled through its review."""
    from opledger.ledger import ForbiddenTransition

    rig = rig_for()
    held = prepare(rig.ledger, "held")
    assert steps.dispatch(rig.ledger, Registry(), held, owner="w1", lease=LEASE).action == "held"
    cancelled = rig.ledger.cancel(held, reason="mistyped action", actor="alice")
    assert cancelled.status is Status.CANCELLED
    assert rig.ledger.history(held).transitions[-1].actor == "alice"

    sent = prepare(rig.ledger, "sent")
    claim = rig.ledger.claim(sent, owner="w1")
    assert claim is not None  # the request left; its answer was lost
    rig.ledger.record_outcome(claim, Ambiguous(code="timeout", reason="no answer"))
    with pytest.raises(ForbiddenTransition, match="nothing of which reached a provider"):
        rig.ledger.cancel(sent, reason="r", actor="alice")
    assert rig.ledger.get(sent).status is Status.UNKNOWN

    reviewed = prepare(rig.ledger, "reviewed")
    assert steps.dispatch(rig.ledger, Registry(), reviewed, owner="w1", lease=LEASE).action == (
        "held"
    )
    op = rig.ledger.get(reviewed)
    assert rig.ledger.open_review(reviewed, fence=op.fence, reason="asked", snapshot={})
    with pytest.raises(ForbiddenTransition):
        rig.ledger.cancel(reviewed, reason="r", actor="alice")


def test_the_hold_backs_off_within_its_bounds() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    op = SimpleNamespace(created_at=now - timedelta(seconds=1))
    assert steps.hold_until(op, now) == now + steps.HOLD_MIN  # type: ignore[arg-type]
    op.created_at = now - timedelta(hours=1)
    assert steps.hold_until(op, now) == now + timedelta(minutes=15)  # type: ignore[arg-type]
    op.created_at = now - timedelta(minutes=8)
    assert steps.hold_until(op, now) == now + timedelta(minutes=2)  # type: ignore[arg-type]
    op.created_at = now - timedelta(days=3)
    assert steps.hold_until(op, now) == now + steps.HOLD_MAX  # type: ignore[arg-type]
