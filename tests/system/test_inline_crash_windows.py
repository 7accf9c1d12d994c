"""The inline path's crash windows: an agent process that claims and sends its acts itself
(`Effects(..., inline=...)`) is SIGKILLed after the claim, after the send and after the
outcome — one act of each contract kind in the window at once — and the sweep and the
workers finish what it left, counted at the providers: one effect each, none lost."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from opledger.dev.chaos.audit import audit
from opledger.dev.chaos.variants import configure_sandbox
from opledger.dev.processes import Stack
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from tests.agentruns import Agents
from tests.inline_agent import ACTIONS

from .conftest import settings_of, settled

pytestmark = [pytest.mark.system, pytest.mark.long]


@pytest.fixture(scope="module")
def agents(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    """Agent processes forked from one that imported the agent once, in the stack's
    environment (its database, broker, providers, short leases)."""
    made = Agents("tests.inline_agent", dict(stack.env), tmp_path_factory.mktemp("inline"))
    yield made
    made.stop()


def _ops(ledger: Ledger, run: str) -> list[str]:
    return [op.id for op in ledger.list(tenant="acme", workflow_id=run)]


def test_an_agent_process_sends_every_kind_inline(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox, agents: Agents
) -> None:
    configure_sandbox(sandbox, settings_of(running.env))
    run = agents.start("-", "inline-plain")
    assert run.wait() == 0, Path(run.err).read_text()[-2000:]
    answers = [json.loads(line) for line in Path(run.out).read_text().splitlines()]
    assert {a["action"] for a in answers} == set(ACTIONS)
    assert {(a["kind"], a["path"]) for a in answers} == {("confirmed", "inline")}
    op_ids = _ops(sys_ledger, "inline-plain")
    result = audit(sys_ledger, sandbox.truth(), op_ids)
    assert result.clean and result.confirmed == len(ACTIONS), result.problems
    for op_id in op_ids:
        assert [a.owner.split(":")[0] for a in sys_ledger.history(op_id).attempts] == ["inline"]


@pytest.mark.parametrize(
    "point", ["dispatch.after_claim", "dispatch.after_call", "dispatch.after_save"]
)
def test_an_agent_killed_in_a_window_leaves_one_effect_each(
    point: str, running: Stack, sys_ledger: Ledger, sandbox: Sandbox, agents: Agents
) -> None:
    configure_sandbox(sandbox, settings_of(running.env))
    run = agents.start(point, f"inline-{point}")
    code = run.wait()
    assert code == -9, f"the agent was not killed at {point}: {Path(run.err).read_text()[-2000:]}"
    op_ids = _ops(sys_ledger, f"inline-{point}")
    assert len(op_ids) == len(ACTIONS)
    # every act was caught in the window: claimed by the agent, none by a worker first
    for op_id in op_ids:
        first = sys_ledger.history(op_id).attempts[0]
        assert first.owner.startswith("inline:"), first
    if point != "dispatch.after_save":
        assert all(sys_ledger.get(o).status is Status.DISPATCHING for o in op_ids)
    settled(sys_ledger, op_ids, timeout=60)  # the sweep, then the worker w1
    result = audit(sys_ledger, sandbox.truth(), op_ids)
    assert result.clean, result.problems
    assert result.ops == len(ACTIONS)
    assert not sys_ledger.list(status=[Status.DISPATCHING, Status.PREPARED])
    if point == "dispatch.after_save":  # saved before the kill: nothing to recover
        assert result.confirmed == len(ACTIONS)
