"""An act of the tenant's scope on a real Postgres: asked from any run of the tenant it is
one operation (unique in the tenant, whatever run asks, even at once), answered with the
run that asked first and the recorded outcome and data; the asker's grant is checked
first; a changed payload is answered, never sent; a deliberate repeat is another act; a
key of the caller's own names an act of its run. The LangGraph tool follows it across
threads. (The MCP gateway: tests/integration/test_mcp_gateway.py; real workers and
Stripe's mock: tests/system/test_stripe.py.)"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import text

from opledger.adapters.crm import CrmAdapter
from opledger.adapters.registry import Registry
from opledger.adapters.stripe import StripeAdapter
from opledger.agents import EffectConfirmed, EffectPending, EffectResult, Effects
from opledger.ledger import (
    AuthorizationRevoked,
    Binding,
    Confirmed,
    InvalidInput,
    Ledger,
    OutOfScope,
    UnknownAuthorization,
)
from opledger.ledger.ids import intent_idempotency_key
from opledger.ledger.intents import Intent

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

REFUND = "stripe.refund.v1"
#: the refund both runs ask: the same charge, amount and reason
ASKED = {"amount": 500, "reason": "duplicate"}


@pytest.fixture
def scoped(ledger: Ledger) -> Ledger:
    """A ledger that knows the bundled Stripe and CRM adapters' declarations (refunds and
    closing a case are the tenant's acts), with acme's grants: two covering Stripe, one
    that covers only email."""
    registry = Registry(
        [
            StripeAdapter("http://127.0.0.1:9", api_key="sk_test_123"),
            CrmAdapter("http://127.0.0.1:9", account="acme"),
        ]
    )
    for ref, scope in (("auth_a", ["stripe.*", "crm.*"]), ("auth_b", ["stripe.*"])):
        ledger.grant(tenant="acme", scope=scope, granted_by="test", ref=ref)
    ledger.grant(tenant="acme", scope=["email.*"], granted_by="test", ref="auth_mail")
    return Ledger(ledger.engine, actions=registry)


@pytest.fixture
def effects(scoped: Ledger) -> Effects:
    return Effects(scoped, publish=lambda op_id: None, poll=30.0)


def refund(
    effects: Effects, run: str, *, charge: str = "ch_1", ref: str = "auth_a", **kw: Any
) -> EffectResult:
    args: dict[str, Any] = {
        "tenant": "acme",
        "run": run,
        "action": REFUND,
        "target": charge,
        "payload": dict(ASKED),
        "authorization_ref": ref,
        "asked_by": f"{run}-call",
    }
    args.update(kw)
    return effects.effect(**args)


def _count(ledger: Ledger) -> int:
    with ledger.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM operations")).scalar_one())


def _confirm(ledger: Ledger, op_id: str, result: dict[str, Any]) -> None:
    claim = ledger.claim(op_id, owner="test-worker")
    assert claim is not None
    binding = Binding(idempotency_key=claim.idempotency_key, target=claim.operation.target)
    ledger.record_outcome(claim, Confirmed(receipt_id="re_1", binding=binding, result=result))


def test_two_runs_asking_the_same_refund_get_one_operation_and_its_outcome(
    scoped: Ledger, effects: Effects
) -> None:
    first = refund(effects, "agent-a")
    assert isinstance(first, EffectPending) and not first.asked_before
    op = first.operation
    assert (op.intent_scope, op.workflow_id) == ("tenant", "agent-a")
    second = refund(effects, "agent-b")  # another run, a restarted agent under a new thread
    assert (second.op_id, second.asked_before, second.differs) == (op.id, True, ())
    assert second.first_asked_in == "agent-a"
    assert second.message.startswith(f"Run agent-a already asked for {REFUND} on ch_1")
    assert refund(effects, "agent-a").first_asked_in is None  # its own run: "This run"
    assert _count(scoped) == 1
    assert [a.asked_by for a in scoped.asks(op.id)] == [
        "agent-a-call",
        "agent-b-call",
        "agent-a-call",
    ]
    # settled: any run asking it is told the outcome and the data, and nothing is sent
    _confirm(scoped, op.id, {"refund": "re_1", "amount": 500})
    later = refund(effects, "agent-c", ref="auth_b")
    assert isinstance(later, EffectConfirmed)
    assert (later.op_id, later.receipt_id, later.data) == (
        op.id,
        "re_1",
        {"refund": "re_1", "amount": 500},
    )
    assert later.first_asked_in == "agent-a" and later.differs == ("authorization_ref",)
    # the provider's key leaves the run out too: the act asked again after the ledger lost
    # its record (a failover, a restore) reaches Stripe under the key it saw, whatever run
    assert op.idempotency_key == intent_idempotency_key(
        scoped._store.key_namespace(),
        tenant="acme",
        workflow_id="",
        action=REFUND,
        intent_key=op.intent_key,
    )
    # closing a case is the tenant's too; updating it is the run's
    close: dict[str, Any] = {
        "action": "crm.close_case.v1",
        "target": "case-1",
        "payload": {"note": "x"},
    }
    assert refund(effects, "a", **close).op_id == refund(effects, "b", **close).op_id
    update: dict[str, Any] = {
        **close,
        "action": "crm.update_case.v1",
        "payload": {"fields": {"p": "high"}},
    }
    assert refund(effects, "a", **update).op_id != refund(effects, "b", **update).op_id


def test_a_changed_payload_is_answered_and_another_amount_is_another_refund(
    scoped: Ledger, effects: Effects
) -> None:
    op = refund(effects, "agent-a").operation
    reworded = refund(effects, "agent-b", payload={"amount": 500, "reason": "fraudulent"})
    assert (reworded.op_id, reworded.differs) == (op.id, ("payload.reason",))
    assert "differs from the recorded one in payload.reason" in reworded.message
    assert scoped.payload(op.id) == ASKED  # nothing of the re-ask was recorded
    asked = scoped.ask_intent(
        Intent(
            tenant="acme",
            workflow_id="agent-c",
            action=REFUND,
            target="ch_1",
            payload={"amount": 500},
            authorization_ref="auth_a",
        )
    )
    assert (asked.operation.id, asked.first, asked.differs) == (op.id, False, ("payload_digest",))
    more = refund(effects, "agent-b", payload={"amount": 600, "reason": "duplicate"})
    assert more.op_id != op.id and more.operation.intent_scope == "tenant"
    # a deliberate second refund of the same amount says so, and is one act too
    again = refund(effects, "agent-b", purpose="second refund")
    assert again.op_id not in (op.id, more.op_id) and not again.asked_before
    assert refund(effects, "agent-c", purpose="Second refund").op_id == again.op_id
    assert _count(scoped) == 3


def test_the_askers_grant_is_checked_before_another_runs_act_is_answered(
    scoped: Ledger, effects: Effects
) -> None:
    op = refund(effects, "agent-a").operation
    asks = len(scoped.asks(op.id))
    with pytest.raises(OutOfScope):  # a grant that does not cover refunds reads nothing
        refund(effects, "agent-b", ref="auth_mail")
    scoped.grant(tenant="globex", scope=["*"], granted_by="test", ref="auth_globex")
    with pytest.raises(UnknownAuthorization):  # nor another tenant's
        refund(effects, "agent-b", ref="auth_globex")
    assert len(scoped.asks(op.id)) == asks
    # another tenant asking the same refund of "its" ch_1 asks its own act
    theirs = refund(effects, "agent-a", ref="auth_globex", tenant="globex")
    assert theirs.op_id != op.id and not theirs.asked_before
    # a revoked grant that covers refunds reads what was done, and records nothing new
    scoped.revoke("auth_b", by="test", reason="rotated")
    assert refund(effects, "agent-b", ref="auth_b").op_id == op.id
    with pytest.raises(AuthorizationRevoked):
        refund(effects, "agent-b", ref="auth_b", charge="ch_2")


def test_a_key_of_your_own_names_an_act_of_your_run(scoped: Ledger, effects: Effects) -> None:
    mine = refund(effects, "agent-a", intent_key="refund-ch_1")
    theirs = refund(effects, "agent-b", intent_key="refund-ch_1")
    assert mine.op_id != theirs.op_id
    assert mine.operation.intent_scope == theirs.operation.intent_scope == "run"
    tenant_key = refund(effects, "agent-a").operation.intent_key
    base: dict[str, Any] = {
        "tenant": "acme",
        "action": REFUND,
        "target": "ch_1",
        "payload": ASKED,
        "authorization_ref": "auth_a",
    }
    with pytest.raises(InvalidInput, match="form of a tenant-wide act's key"):
        scoped.prepare(workflow_id="agent-c", intent_key=tenant_key, **base)
    with pytest.raises(InvalidInput, match="not such a key"):
        scoped.ask_intent(Intent(workflow_id="c", intent_key="mine", scope="tenant", **base))
    with pytest.raises(InvalidInput, match="the scope is the action's declaration"):
        scoped.ask_intent(Intent(workflow_id="agent-c", scope="run", **base))
    assert _count(scoped) == 3
    assert Ledger(scoped.engine).intent_scope(REFUND) == "run"  # no declarations: the run's


def test_runs_asking_at_once_record_one_operation(scoped: Ledger, effects: Effects) -> None:
    """Each of 6 charges refunded by 3 runs at the same moment: one operation each."""
    runs, charges = 3, [f"ch_race_{n}" for n in range(6)]
    barrier = threading.Barrier(runs)
    answers: dict[str, list[EffectResult]] = {c: [] for c in charges}
    errors: list[BaseException] = []

    def agent(n: int) -> None:
        try:
            for charge in charges:
                barrier.wait(10)
                answers[charge].append(refund(effects, f"racer-{n}", charge=charge))
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for charge in charges:
        assert len({a.op_id for a in answers[charge]}) == 1, charge
        assert sorted(a.asked_before for a in answers[charge]) == [False, True, True]
    assert _count(scoped) == len(charges)


def test_a_langgraph_tool_asked_from_another_thread_or_a_fork_answers_the_first(
    scoped: Ledger, effects: Effects
) -> None:
    """A restarted agent under a new thread id, and a fork into a thread of its own, ask
    the refund again: the first thread's operation; a fork under a grant of its own that
    does not cover refunds is refused, told nothing of it."""
    from pydantic import BaseModel

    from opledger.agents.langgraph import effect_tool

    class RefundArgs(BaseModel):
        charge: str
        amount: int

    def grant_of(config: RunnableConfig) -> str:
        thread = str((config.get("configurable") or {}).get("thread_id"))
        return "auth_mail" if thread.startswith("fork-mail") else "auth_a"

    tool = effect_tool(
        effects,
        name="refund",
        description="Refund a charge",
        args_schema=RefundArgs,
        tenant="acme",
        action=REFUND,
        authorization_ref=grant_of,
        effect_of=lambda args: (args["charge"], {"amount": args["amount"]}),
        wait=None,
    )

    def call(thread: str, call_id: str) -> tuple[str, dict[str, Any]]:
        config: RunnableConfig = {"configurable": {"thread_id": thread}}
        message = tool.invoke(
            {
                "type": "tool_call",
                "id": call_id,
                "name": "refund",
                "args": {"charge": "ch_9", "amount": 700},
            },
            config,
        )
        return str(message.status), json.loads(message.content)

    status, first = call("t-1", "call_1")
    assert status == "success" and first["asked_before"] is False
    for thread in ("t-1-restarted", "fork-t-1"):
        status, again = call(thread, f"call_{thread}")
        assert status == "success" and again["op_id"] == first["op_id"], again
        assert again["asked_before"] is True
        assert again["message"].startswith("Run langgraph:t-1 already asked"), again
    status, refused = call("fork-mail-1", "call_x")
    assert status == "error" and refused["kind"] == "refused", refused
    assert refused["error"] == "OutOfScope" and first["op_id"] not in json.dumps(refused)
    assert _count(scoped) == 1
