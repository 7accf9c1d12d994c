"""An agent and a worker configured with different adapters (OPLEDGER_ADAPTERS): the worker
holds the operation it has no adapter for (nothing sent, ledger evidence `why: no_adapter`),
and the agent is told so, not that it may have happened; `opledger check`, run with the
agent's configuration (which serves the action), names the action the workers hold."""

from __future__ import annotations

import os

from opledger.adapters.registry import Registry, load_registry
from opledger.agents import EffectPending, Effects
from opledger.agents.answers import summary
from opledger.cli.checks import run_checks
from opledger.ledger import Ledger, Status
from opledger.settings import Settings
from opledger.tasks.worker import FollowUps, Step, Worker


def test_a_worker_without_the_adapter_holds_it_and_the_agent_is_told_it_was_not_sent(
    ledger: Ledger, grant: str, database_url: str
) -> None:
    served = load_registry(Settings.from_environ({}))  # the agent's: the bundled adapters
    action = "crm.close_case.v1"
    assert action in served.actions
    # the worker's: another configuration, without the CRM adapter
    theirs = Registry([served.adapter_for("email.smtp_send.v1")])
    worker = Worker(ledger, theirs, owner="w-other", follow_ups=FollowUps())
    steps = []
    effects = Effects(
        Ledger(ledger.engine, actions=served),
        publish=lambda op_id: steps.append(worker.dispatch(op_id).action),
    )
    result = effects.effect(
        tenant="acme",
        run="r1",
        action=action,
        target="case-7",
        payload={"note": "n"},
        authorization_ref=grant,
    )
    assert steps == [Step.HELD]
    told = effects.result(result.op_id)
    history = ledger.history(result.op_id)
    assert history.operation.status is Status.UNKNOWN  # the ledger's status: held
    (evidence,) = history.evidence
    assert evidence.detail["why"] == "no_adapter" and evidence.detail["code"] == "not_sent"

    assert isinstance(told, EffectPending) and told.awaiting == "worker", told
    assert told.message.startswith(
        f"{action} on case-7 is not sent: no worker that took it serves {action}"
    ), told.message
    assert told.not_sent is not None
    assert "it may have" not in told.message
    said = summary(told)
    assert said["kind"] == "pending" and said["message"] == told.message

    env = {
        "OPLEDGER_DATABASE_URL": database_url,
        "OPLEDGER_DATABASE_SCHEMA": os.environ.get("OPLEDGER_DATABASE_SCHEMA", ""),
    }
    (actions,) = [c for c in run_checks(env, broker=False) if c.name == "actions"]
    assert actions.warning and not actions.ok, actions
    assert f"workers without its adapter hold operations of {action} (1 operation)" in (
        actions.detail
    ), actions.detail
