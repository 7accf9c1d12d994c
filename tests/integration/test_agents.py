"""The agent API on a real Postgres, with the test in the worker's place: ordered effects
(the claim's gate, cancellation on a failed dependency, the visible reason while one is
unknown, cycles), replayed steps, and a waiting `effect()` woken by NOTIFY."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

import pytest
from pydantic import ValidationError

from opledger.agents import (
    EffectCancelled,
    EffectConfirmed,
    EffectPending,
    EffectRejected,
    EffectResult,
    Effects,
    EffectUnknown,
)
from opledger.ledger import (
    Ambiguous,
    Binding,
    Confirmed,
    DependencyCycle,
    IntentConflict,
    InvalidInput,
    Ledger,
    Rejected,
    Status,
    UnknownDependency,
)

if TYPE_CHECKING:  # the LangGraph extra, imported by the tests that use it
    from langchain_core.messages import ToolMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool


class Published(list[str]):
    def __call__(self, op_id: str) -> None:
        self.append(op_id)


@pytest.fixture
def published() -> Published:
    return Published()


@pytest.fixture
def effects(ledger: Ledger, grant: str, published: Published) -> Effects:
    return Effects(ledger, publish=published, poll=30.0)


@pytest.fixture
def agent_effects(ledger: Ledger, grant: str, published: Published) -> Effects:
    """Effects over a ledger that knows the bundled adapters' intent fields, as
    `opledger.tasks.app.runtime().ledger` does."""
    from opledger.adapters.crm import CrmAdapter
    from opledger.adapters.email import EmailAdapter
    from opledger.adapters.registry import Registry

    registry = Registry(
        [
            CrmAdapter("http://127.0.0.1:9", account="acme"),
            EmailAdapter("http://127.0.0.1:9", account="acme"),
        ]
    )
    return Effects(Ledger(ledger.engine, actions=registry), publish=published, poll=30.0)


def _effect(effects: Effects, step: str, **kw: Any) -> EffectResult:
    args: dict[str, Any] = {
        "tenant": "acme",
        "run": "onboarding-42",
        "intent_key": step,
        "action": "crm.close_case.v1",
        "target": "case-318",
        "payload": {"note": step},
        "authorization_ref": "auth_acme",
    }
    args.update(kw)
    return effects.effect(**args)


def _settle(ledger: Ledger, op_id: str, outcome: str = "confirmed") -> None:
    claim = ledger.claim(op_id, owner="test-worker")
    assert claim is not None, f"{op_id} was not claimable"
    if outcome == "confirmed":
        binding = Binding(idempotency_key=claim.idempotency_key, target=claim.operation.target)
        ledger.record_outcome(claim, Confirmed(receipt_id=f"r-{op_id}", binding=binding))
    elif outcome == "rejected":
        ledger.record_outcome(claim, Rejected(code="case_not_found", reason="no such case"))
    else:
        ledger.record_outcome(claim, Ambiguous(code="timeout", reason="no answer"))


def test_a_step_is_recorded_once_and_replays_return_its_state(
    ledger: Ledger, effects: Effects, published: Published
) -> None:
    first = _effect(effects, "close-case")
    assert isinstance(first, EffectPending) and published == [first.op_id]
    _settle(ledger, first.op_id)
    again = _effect(effects, "close-case")
    assert isinstance(again, EffectConfirmed)
    assert again.op_id == first.op_id and again.receipt_id == f"r-{first.op_id}"
    assert published == [first.op_id]  # a settled operation is not enqueued again
    assert again.asked_before and again.differs == ()
    # the same step asked with another payload: answered with the recorded one, not sent
    changed = _effect(effects, "close-case", payload={"note": "changed"}, asked_by="call_9")
    assert isinstance(changed, EffectConfirmed) and changed.op_id == first.op_id
    assert changed.differs == ("payload.note",) and "not sent" in changed.message
    assert published == [first.op_id]
    asks = ledger.asks(first.op_id)
    assert [(a.asked_by, a.differs) for a in asks] == [
        (None, ()),
        (None, ()),
        ("call_9", ("payload_digest",)),
    ]
    with pytest.raises(IntentConflict):  # the ledger's own prepare still refuses it
        ledger.prepare(
            tenant="acme",
            workflow_id="onboarding-42",
            intent_key="close-case",
            action="crm.close_case.v1",
            target="case-318",
            payload={"note": "changed"},
            authorization_ref="auth_acme",
        )
    with pytest.raises(InvalidInput):
        _effect(effects, "close-case", wait=-1)


def test_a_dependent_is_not_claimed_until_its_dependency_is_confirmed(
    ledger: Ledger, effects: Effects, published: Published
) -> None:
    close = _effect(effects, "close-case")
    email = _effect(
        effects, "email-owner", action="email.send.v1", target="owner@acme.test", after=[close]
    )
    assert isinstance(email, EffectPending)
    assert [d.op_id for d in email.blocked_by] == [close.op_id]
    assert email.op_id not in published  # a waiting operation is not enqueued
    assert ledger.claim(email.op_id, owner="w") is None
    _settle(ledger, close.op_id)
    released = effects.result(email.op_id)
    assert isinstance(released, EffectPending) and not released.blocked_by
    # (and for beat, which no test of this file runs: its relay publishes what no worker got)
    assert released.waiting_for.startswith("a worker to take it; it waits for beat, none has")
    _settle(ledger, email.op_id)


def test_a_rejected_dependency_cancels_its_dependents_with_its_reason(
    ledger: Ledger, effects: Effects
) -> None:
    close = _effect(effects, "close-case")
    email = _effect(effects, "email-owner", target="case-1", after=[close])
    follow_up = _effect(effects, "follow-up", target="case-2", after=[email.op_id])
    _settle(ledger, close.op_id, "rejected")
    for dependent in (email, follow_up):
        result = effects.result(dependent.op_id)
        assert isinstance(result, EffectCancelled), result
        assert "rejected" in result.reason
    cancelled = effects.result(email.op_id)
    assert isinstance(cancelled, EffectCancelled) and close.op_id in cancelled.reason
    rejected = effects.result(close.op_id)
    assert isinstance(rejected, EffectRejected) and rejected.code == "case_not_found"
    # a new dependent of a rejected operation is cancelled at once
    late = _effect(effects, "too-late", target="case-3", after=[close])
    assert isinstance(late, EffectCancelled) and close.op_id in late.reason


def test_an_unknown_dependency_keeps_the_dependent_waiting_with_a_visible_reason(
    ledger: Ledger, effects: Effects
) -> None:
    close = _effect(effects, "close-case")
    email = _effect(effects, "email-owner", target="case-9", after=[close])
    _settle(ledger, close.op_id, "unknown")
    op = ledger.get(close.op_id)
    review = ledger.open_review(op.id, fence=op.fence, reason="no dedup and no lookup")
    assert review is not None
    started = time.monotonic()
    waited = effects.wait(email.op_id, timeout=10)
    assert time.monotonic() - started < 2  # a person holds the dependency: no point waiting
    assert isinstance(waited, EffectPending)
    (blocker,) = waited.blocked_by
    assert blocker.status is Status.UNKNOWN and blocker.review_id == review.id
    assert f"review {review.id}" in waited.waiting_for
    assert ledger.claim(email.op_id, owner="w") is None
    held = effects.result(close.op_id)
    assert isinstance(held, EffectUnknown) and held.review is not None
    assert not held.final


def test_dependencies_are_checked_and_a_cycle_is_refused(ledger: Ledger, effects: Effects) -> None:
    a = _effect(effects, "a")
    b = _effect(effects, "b", target="case-1", after=[a])
    # replaying step "a" as if it ran after b (or itself): answered, nothing written
    for cyclic in ([b], [a]):
        answer = _effect(effects, "a", after=cyclic)
        assert answer.asked_before and answer.differs == ("after",)
    assert ledger.dependencies(a.op_id) == ()
    answer = _effect(effects, "b", target="case-1", after=[])  # another dependency set
    assert answer.differs == ("after",)
    with pytest.raises(DependencyCycle):  # the ledger's prepare refuses a cycle
        ledger.prepare(
            tenant="acme",
            workflow_id="onboarding-42",
            intent_key="a",
            action="crm.close_case.v1",
            target="case-318",
            payload={"note": "a"},
            authorization_ref="auth_acme",
            after=[b.op_id],
        )
    with pytest.raises(UnknownDependency):
        _effect(effects, "c", after=["op_01J00000000000000000000000"])
    other = ledger.grant(tenant="beta", scope=["crm.*"], granted_by="t", ref="auth_beta")
    with pytest.raises(UnknownDependency):  # another tenant's operation is not visible
        _effect(effects, "d", tenant="beta", authorization_ref=other.ref, after=[a])
    with pytest.raises(InvalidInput):
        _effect(effects, "e", after=a.op_id)


def test_the_relay_holds_waiting_dependents_and_publishes_released_ones_at_once(
    ledger: Ledger, effects: Effects
) -> None:
    close = _effect(effects, "close-case")
    email = _effect(effects, "email-owner", target="case-5", after=[close])
    relayed: list[str] = []
    ledger.relay(older_than=timedelta(0), publish=lambda op_id, gen: relayed.append(op_id))
    assert close.op_id in relayed and email.op_id not in relayed
    _settle(ledger, close.op_id)
    relayed.clear()
    ledger.relay(older_than=timedelta(hours=1), publish=lambda op_id, gen: relayed.append(op_id))
    assert relayed == [email.op_id]
    relayed.clear()
    ledger.relay(older_than=timedelta(hours=1), publish=lambda op_id, gen: relayed.append(op_id))
    assert relayed == []  # published once on release, then the usual backoff


def test_a_waiting_effect_returns_within_a_second_of_the_settle(
    ledger: Ledger, effects: Effects
) -> None:
    """The waiter polls every 30 s (the fixture): only the NOTIFY can wake it in time."""
    close = _effect(effects, "close-case")
    settled_at: list[float] = []

    def settle_later() -> None:
        time.sleep(1.0)
        _settle(ledger, close.op_id)
        settled_at.append(time.monotonic())

    worker = threading.Thread(target=settle_later)
    worker.start()
    result = _effect(effects, "close-case", wait=20)
    returned = time.monotonic()
    worker.join()
    assert isinstance(result, EffectConfirmed)
    assert returned - settled_at[0] < 1.0


def test_the_async_wait_is_woken_by_the_notify_too(ledger: Ledger, effects: Effects) -> None:
    async def scenario() -> tuple[object, float]:
        pending = await effects.aeffect(
            tenant="acme",
            run="onboarding-42",
            intent_key="close-case",
            action="crm.close_case.v1",
            target="case-318",
            payload={"note": "close-case"},
            authorization_ref="auth_acme",
        )
        waiter = asyncio.create_task(effects.await_result(pending.op_id, 20))
        await asyncio.sleep(1.0)
        await asyncio.to_thread(_settle, ledger, pending.op_id)
        settled_at = time.monotonic()
        result = await waiter
        return result, time.monotonic() - settled_at

    result, lag = asyncio.run(scenario())
    assert isinstance(result, EffectConfirmed)
    assert lag < 1.0


def test_a_wait_that_runs_out_says_what_it_waits_for(ledger: Ledger, effects: Effects) -> None:
    close = _effect(effects, "close-case")
    _settle(ledger, close.op_id, "unknown")
    started = time.monotonic()
    result = effects.wait(close.op_id, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 2
    assert isinstance(result, EffectUnknown) and result.review is None
    assert result.waiting_for.startswith("evidence")


def test_a_langgraph_tool_call_is_one_effect_per_act_whatever_its_call_id(
    ledger: Ledger, agent_effects: Effects, published: Published
) -> None:
    effects = agent_effects
    import json

    from pydantic import BaseModel

    from opledger.agents.langgraph import effect_tool

    class CloseArgs(BaseModel):
        case_id: str

    tool = effect_tool(
        effects,
        name="close_case",
        description="Close a CRM case",
        args_schema=CloseArgs,
        tenant="acme",
        action="crm.close_case.v1",
        authorization_ref="auth_acme",
        effect_of=lambda args: (args["case_id"], {"note": f"closed ({args['case_id']})"}),
        wait=None,
    )
    config: RunnableConfig = {
        "configurable": {"thread_id": "t-7"},
        "metadata": {"langgraph_node": "tools"},
    }

    def call(call_id: str, case_id: str, **extra: object) -> dict[str, object]:
        message = tool.invoke(
            {
                "type": "tool_call",
                "id": call_id,
                "name": "close_case",
                "args": {"case_id": case_id, **extra},
            },
            config,
        )
        answer: dict[str, object] = json.loads(message.content)
        return answer

    first = call("call_1", "case-318")
    op = ledger.get(str(first["op_id"]))
    assert (op.workflow_id, op.target) == ("langgraph:t-7", "case-318")
    assert op.intent_key == effects.intent_of(
        action="crm.close_case.v1", target="case-318", payload={"note": "closed (case-318)"}
    )
    assert first["kind"] == "pending" and first["asked_before"] is False
    # the model asked again: a new call id, the same act: the recorded operation
    again = call("call_2", "case-318")
    assert again["op_id"] == op.id and again["asked_before"] is True
    assert "already asked" in str(again["message"]) and "Wait for it" in str(again["message"])
    assert published == [op.id, op.id]  # still prepared: enqueued again, claimed once
    assert [a.asked_by for a in ledger.asks(op.id)] == ["tools:call_1", "tools:call_2"]
    _settle(ledger, op.id)
    done = call("call_2b", "case-318")  # settled: how to ask for a deliberate repeat
    assert done["kind"] == "confirmed" and "`repeat` set to 2" in str(done["message"])
    # another case is another act, whatever the call id
    assert call("call_1", "case-999")["op_id"] != op.id
    # a deliberate repeat says so with a number, which a re-asked model repeats faithfully
    second = call("call_3", "case-318", repeat=2)
    assert second["op_id"] != op.id and second["asked_before"] is False
    assert call("call_4", "case-318", repeat=2)["op_id"] == second["op_id"]
    assert call("call_5", "case-318", repeat=1)["op_id"] == op.id  # the first time
    with pytest.raises(ValidationError):
        call("call_6", "case-318", repeat=0)
    with pytest.raises(InvalidInput):  # no thread: the graph is misconfigured, not the call
        tool.invoke(
            {"type": "tool_call", "id": "call_5", "name": "close_case", "args": {"case_id": "x"}},
            {"metadata": {"langgraph_node": "tools"}},
        )


def test_a_tool_answers_a_refused_call_to_the_model_and_records_nothing(
    ledger: Ledger, agent_effects: Effects
) -> None:
    effects = agent_effects
    import json

    from pydantic import BaseModel

    from opledger.agents.langgraph import effect_tool

    class EmailArgs(BaseModel):
        to: str

    tool = effect_tool(
        effects,
        name="email",
        description="Email someone",
        args_schema=EmailArgs,
        tenant="acme",
        action="email.send.v1",
        authorization_ref="auth_acme",
        effect_of=lambda args: (args["to"], {"to": args["to"]}),
        wait=None,
        repeatable=False,
    )
    schema = tool.get_input_schema()
    assert issubclass(schema, BaseModel)  # langchain types it as a pydantic v1 or v2 model
    assert "repeat" not in schema.model_fields
    config: RunnableConfig = {
        "configurable": {"thread_id": "t-8"},
        "metadata": {"langgraph_node": "tools"},
    }

    def call(call_id: str, to: str) -> tuple[str, dict[str, object]]:
        message = tool.invoke(
            {"type": "tool_call", "id": call_id, "name": "email", "args": {"to": to}}, config
        )
        return message.status, json.loads(message.content)

    status, sent = call("call_1", "a@acme.test")
    assert status == "success"
    _settle(ledger, str(sent["op_id"]))
    ledger.revoke("auth_acme", by="test", reason="the run is over")
    # the act already recorded is answered though the grant is revoked (a read)...
    status, again = call("call_2", "a@acme.test")
    assert status == "success" and again["op_id"] == sent["op_id"] and again["asked_before"]
    assert "at most once" in str(again["message"])
    # ...a new act needs a grant in force: refused, in words the model reads
    status, refused = call("call_3", "b@acme.test")
    assert status == "error" and refused["kind"] == "refused"
    assert refused["error"] == "AuthorizationRevoked"
    status, invalid = call("call_4", "b\u200b@acme.test")  # an invisible character
    assert status == "error" and invalid["error"] == "InvalidIdentifier"
    assert [o.target for o in ledger.list(tenant="acme")] == ["a@acme.test"]


def test_an_intent_needs_a_declaration_and_one_key_names_one_act(
    ledger: Ledger, effects: Effects, agent_effects: Effects
) -> None:
    """A ledger without the adapter registry cannot derive an agent's intent: two processes
    built differently would key one act twice. Under a key of the caller's own, another
    action or target is refused: one key cannot name two acts."""
    import asyncio
    import json

    from pydantic import BaseModel

    from opledger.agents.langgraph import effect_tool
    from opledger.ledger import IntentFieldsUndeclared

    with pytest.raises(IntentFieldsUndeclared, match="adapter registry"):
        effects.effect(
            tenant="acme",
            run="r",
            action="crm.close_case.v1",
            target="case-1",
            payload={},
            authorization_ref="auth_acme",
        )
    _effect(effects, "close-case")
    with pytest.raises(IntentConflict):
        _effect(effects, "close-case", target="case-2")

    class Args(BaseModel):
        case_id: str

    def tool_of(effects: Effects) -> BaseTool:
        return effect_tool(
            effects,
            name="close_case",
            description="Close a case",
            args_schema=Args,
            tenant="acme",
            action="crm.close_case.v1",
            authorization_ref="auth_acme",
            effect_of=lambda args: (args["case_id"], {}),
            wait=5,
        )

    config: RunnableConfig = {
        "configurable": {"thread_id": "t-9"},
        "metadata": {"langgraph_node": "tools"},
    }
    call = {"type": "tool_call", "id": "call\x00", "name": "close_case", "args": {"case_id": "c"}}
    with pytest.raises(IntentFieldsUndeclared):  # a setup error: raised, not answered
        tool_of(effects).invoke(call, config)

    # natively async: the wait is an asyncio wait, the ask kept its odd id as text
    async def ask() -> ToolMessage:  # what a tool answers a tool call with
        return cast("ToolMessage", await tool_of(agent_effects).ainvoke(call, config))

    async def settle_soon() -> ToolMessage:
        answer = asyncio.create_task(ask())
        while not ledger.list(tenant="acme", limit=5) or len(ledger.list(tenant="acme")) < 2:
            await asyncio.sleep(0.05)
        op = next(o for o in ledger.list(tenant="acme") if o.target == "c")
        await asyncio.to_thread(_settle, ledger, op.id)
        return await answer

    message = asyncio.run(settle_soon())
    assert isinstance(message.content, str)  # the tool's JSON answer
    answer = json.loads(message.content)
    assert answer["kind"] == "confirmed"
    assert [a.asked_by for a in ledger.asks(answer["op_id"])] == ["tools:call?"]

    class Clash(BaseModel):
        repeat: int

    with pytest.raises(ValueError, match="repeatable=False"):
        effect_tool(
            agent_effects,
            name="x",
            description="x",
            args_schema=Clash,
            tenant="acme",
            action="crm.close_case.v1",
            authorization_ref="auth_acme",
            effect_of=lambda args: ("c", {}),
        )


def test_an_effect_left_for_later_says_it_waits_for_room_at_its_provider(
    ledger: Ledger, effects: Effects
) -> None:
    pending = _effect(effects, "roomless")
    assert isinstance(pending, EffectPending) and pending.awaiting == "worker"
    # the gate refused it (the provider at its limits): no claim, a time to try again
    ledger.defer(pending.op_id, until=datetime.now(UTC) + timedelta(seconds=30))
    later = effects.result(pending.op_id)
    assert isinstance(later, EffectPending) and later.awaiting == "provider"
    assert later.waiting_for.startswith("room at crm (its limits")
