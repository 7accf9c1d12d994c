"""An unknown operation whose provider has no lookup (SMTP without a Sent folder) is never
told to wait for a check to find evidence: no check can. The agent is told what happens
when it comes due, which is what the retry rules decide then (rule 7: a person)."""

from __future__ import annotations

from datetime import timedelta

from opledger.adapters.registry import load_registry
from opledger.adapters.smtp import smtp_contract
from opledger.agents.effects import Effects
from opledger.agents.results import EffectUnknown, result_of
from opledger.ledger import Ambiguous, Ledger
from opledger.ledger.decide import NeedsReview, ReviewPolicy, decide
from opledger.settings import Settings
from opledger.tasks.worker import FollowUps, Worker
from tests.intents import prepare, smtp_mail


def test_an_smtp_send_without_a_sent_folder_waits_for_a_person_not_a_check(
    ledger: Ledger, grant: str
) -> None:
    # the bundled adapters as configured by default: SMTP with no Sent folder
    registry = load_registry(Settings.from_environ({}))
    plain = registry.contract_for(smtp_mail()["action"])
    assert plain.lookup.kind == "none" and plain.idempotency.kind == "none"
    ledger = Ledger(ledger.engine, actions=registry)
    op_id = prepare(ledger, "lost", **smtp_mail())
    claim = ledger.claim(op_id, owner="w", terms=registry.claim_terms(timedelta(seconds=30)))
    assert claim is not None
    ledger.record_outcome(claim, Ambiguous(code="connection_lost", reason="after DATA"))
    # the worker's first check: nothing to look up, and it may still be in flight
    Worker(ledger, registry, owner="w", follow_ups=FollowUps()).reconcile(op_id)
    answer = ledger.answer(op_id)
    due = answer.operation.next_check_at
    (attempt,) = ledger.history(op_id).attempts
    assert due is not None and due == attempt.deadline_at

    told = result_of(answer, plain)
    # what the agent's own calls say (Effects reads the contract from the ledger's adapters)
    agent = Effects(ledger, publish=lambda op_id: None).result(op_id)
    assert agent.message == told.message
    assert isinstance(told, EffectUnknown) and told.review is None
    assert "evidence" not in told.waiting_for, told.message
    assert told.waiting_for.startswith("a person: smtp can neither be asked"), told.message
    assert (
        f"a review opens once it can no longer be in flight (checked next at {due.isoformat()})"
        in told.message
    )
    # what it says is what the rules do when it comes due: a person is asked
    history = ledger.history(op_id)
    decided = decide(
        plain,
        history.operation,
        history.attempts,
        history.evidence,
        ledger.authorization(history.operation.authorization_ref),
        due + timedelta(seconds=1),
        ReviewPolicy(),
    )
    assert isinstance(decided, NeedsReview), decided

    # with a Sent folder to search, or said without the contract: the next check looks
    searched = smtp_contract(sent_search_lag=timedelta(minutes=1))
    for contract in (searched, None):
        looked = result_of(answer, contract)
        assert looked.message.endswith(f"evidence: the next check at {due.isoformat()}.")
