"""Approvals end to end (docs/approvals.md): real Celery workers and beat, the sandbox CRM on
loopback counting the requests it receives, a real `opledger console` process driven by
Debian's Chromium, and an agent asking as agents do (`Effects`, and a LangGraph tool that
pauses its graph for an approval). The rig: `tests/system/held_acts.py`.

Counted at the provider, for each act: held for a person, it sends nothing (never
claimed, not even by a worker handed a message for it), however it is asked again; approved
in the browser, it is sent exactly once and every later ask (a resumed graph, a new call
id, a tool call retried from scratch) gets its outcome; a changed credit is another act
with its own approval; a denial reaches the agent as a refusal and its run ends normally;
the agent's identity never approves; two operators approving at once send it once.

One stack, console, policy and pair of browsers for the module: each test asks on cases of
its own, so none depends on another's acts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from opledger.adapters.registry import load_registry
from opledger.agents import EffectCancelled, EffectConfirmed, Effects
from opledger.dev.processes import Stack
from opledger.dev.sandbox import Sandbox
from opledger.ledger import IntentConflict, Ledger, NotAnApprover, Status
from tests.consoles import browser_sign_in, chromium

from .conftest import settings_of
from .held_acts import (
    GRANT,
    UPDATE,
    Desk,
    after_decision,
    applied,
    approvals_of,
    ask,
    confirmed,
    desk_on,
    graph_of,
    handed_to_a_worker,
    held,
    model_asks,
    open_approval,
    resume,
    sent,
    tool_answer,
    untouched,
)

if TYPE_CHECKING:  # Selenium is imported once there is a browser
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def desk(
    stack: Stack,
    session_ledger: Ledger,
    database_url: str,
    sandbox_server: Sandbox,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Desk]:
    state = tmp_path_factory.mktemp("approvals-flow")
    with desk_on(stack, session_ledger, database_url, sandbox_server, state) as rig:
        yield rig


@pytest.fixture(scope="module")
def browsers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WebDriver, WebDriver]]:
    """Two browsers: two operators' sessions side by side."""
    with (
        chromium(tmp_path_factory.mktemp("chromium-a")) as a,
        chromium(tmp_path_factory.mktemp("chromium-b")) as b,
    ):
        yield a, b


# -- the tests ------------------------------------------------------------------------------


def test_a_held_credit_sends_nothing_until_approved_in_the_console_then_exactly_once(
    desk: Desk, browsers: tuple[WebDriver, WebDriver]
) -> None:
    from selenium.webdriver.common.by import By

    case, thread = "case-approve", "t-approve"
    graph = graph_of(desk.effects)
    config: Any = {"configurable": {"thread_id": thread}}
    paused = graph.invoke(model_asks(case, 25_000, "call_1"), config)
    answer = paused["__interrupt__"][0].value  # the graph pauses for the approval
    assert (answer["kind"], answer["awaiting"]) == ("pending", "approval")
    op_id = answer["op_id"]

    # under the threshold the same act is not held: the workers send it at once
    small = ask(desk.effects, "case-small", 500, "call_s", wait=20)
    assert isinstance(small, EffectConfirmed), small
    assert sent(desk, small.op_id) == 1
    # the held one: a worker handed a message for it claims nothing and sends nothing
    handed_to_a_worker(desk, op_id)
    untouched(desk, op_id)

    # asked again before anyone decided: the same operation, the one approval request
    again = resume(graph, config)  # resumed: it asks again, and pauses again
    assert again["__interrupt__"][0].value["op_id"] == op_id
    # the model re-planned, under a new tool-call id
    replanned = held(ask(desk.effects, case, 25_000, "call_2", run=f"langgraph:{thread}"))
    assert (replanned.op_id, replanned.asked_before) == (op_id, True)
    assert approvals_of(desk, case) == [op_id]
    untouched(desk, op_id)

    # an operator approves it in the console: released, sent once
    d = browsers[0]
    browser_sign_in(d, desk.url, "alice")
    d.find_element(By.ID, "nav-approvals").click()
    d.find_element(By.CSS_SELECTOR, f"tr[data-op='{op_id}'] a.op-link").click()
    assert "25000 is above 10000" in d.find_element(By.ID, "reasons").text
    assert d.find_element(By.ID, "digest").text == desk.ledger.get(op_id).payload_digest
    d.find_element(By.ID, "approve-note").send_keys("checked the complaint")
    d.find_element(By.ID, "approve").click()
    assert "is released and will be sent once" in after_decision(d)
    confirmed(desk, op_id)
    assert (sent(desk, op_id), applied(desk, case)) == (1, 1)

    # the paused run resumed: the outcome, the same operation
    done = resume(graph, config)
    assert "__interrupt__" not in done
    outcome = tool_answer(done)
    assert (outcome["kind"], outcome["op_id"], outcome["asked_before"]) == (
        "confirmed",
        op_id,
        True,
    )
    # re-asked after the approval under a new call id: its outcome
    later = ask(desk.effects, case, 25_000, "call_3", run=f"langgraph:{thread}")
    assert isinstance(later, EffectConfirmed) and later.op_id == op_id and later.asked_before
    # the tool call retried from scratch (a new process's ledger and surface)
    fresh_registry = load_registry(settings_of(desk.env))
    try:
        fresh = Effects(Ledger(desk.ledger.engine, actions=fresh_registry))
        retried = ask(fresh, case, 25_000, "retry-1", run=f"langgraph:{thread}", wait=5)
    finally:
        fresh_registry.close()
    assert isinstance(retried, EffectConfirmed), retried
    assert (retried.op_id, retried.asked_before, retried.receipt_id) == (
        op_id,
        True,
        later.receipt_id,
    )
    # and a repeated message for it: nothing more at the provider
    handed_to_a_worker(desk, op_id)
    assert (sent(desk, op_id), applied(desk, case)) == (1, 1)
    assert approvals_of(desk, case) == [op_id]
    approval = desk.ledger.approval(op_id)
    assert approval.approved_by == ("alice",)
    assert approval.consumed_fence == desk.ledger.get(op_id).fence == 1


def test_a_changed_credit_is_another_act_with_its_own_approval(desk: Desk) -> None:
    case = "case-changed"
    first = held(ask(desk.effects, case, 25_000, "call_1"))
    reworded = held(ask(desk.effects, case, 25_000, "call_2", note="a kinder note"))
    assert (reworded.op_id, reworded.asked_before) == (first.op_id, True)
    assert reworded.differs == ("payload.note",)  # wording: the same act, not sent
    changed = held(ask(desk.effects, case, 30_000, "call_3"))
    assert changed.op_id != first.op_id and not changed.asked_before
    assert sorted(approvals_of(desk, case)) == sorted([first.op_id, changed.op_id])
    # an intent the caller names with its own key: a changed credit under it is not a new
    # act; the agent is answered with the recorded one (the change named, never sent),
    # and `prepare` refuses it outright
    keyed = held(ask(desk.effects, case, 40_000, "call_4", intent_key="credit-once"))
    rekeyed = held(ask(desk.effects, case, 45_000, "call_5", intent_key="credit-once"))
    assert (rekeyed.op_id, rekeyed.differs) == (keyed.op_id, ("payload.fields",))
    with pytest.raises(IntentConflict):
        desk.ledger.prepare(
            tenant="acme",
            workflow_id="run-1",
            intent_key="credit-once",
            action=UPDATE,
            target=case,
            payload={"fields": {"credit": 45_000}, "note": "goodwill credit"},
            authorization_ref=GRANT,
        )
    assert len(approvals_of(desk, case)) == 3

    op = desk.ledger.get(first.op_id)
    desk.ledger.approve(op.id, operator="alice", digest=op.payload_digest)
    confirmed(desk, op.id)
    assert sent(desk, op.id) == 1
    # approving one never releases the other
    for other in (changed.op_id, keyed.op_id):
        handed_to_a_worker(desk, other)
        untouched(desk, other)
        assert desk.ledger.approval(other).status == "pending"
    assert applied(desk, case) == 1


def test_a_denial_in_the_console_reaches_the_agent_as_a_refusal_and_its_run_ends(
    desk: Desk, browsers: tuple[WebDriver, WebDriver]
) -> None:
    from selenium.webdriver.common.by import By

    case, thread = "case-deny", "t-deny"
    graph = graph_of(desk.effects)
    config: Any = {"configurable": {"thread_id": thread}}
    op_id = graph.invoke(model_asks(case, 25_000, "call_1"), config)["__interrupt__"][0].value[
        "op_id"
    ]
    d = browsers[0]
    open_approval(d, desk, op_id, "alice")
    d.find_element(By.ID, "deny-note").send_keys("wrong customer")
    d.find_element(By.ID, "deny").click()
    assert "is cancelled" in after_decision(d)
    assert "denied by alice: wrong customer" in d.find_element(By.ID, "operation-status").text

    done = resume(graph, config)  # the run goes on: the model reads a refusal
    assert "__interrupt__" not in done and graph.get_state(config).next == ()
    answer = tool_answer(done)
    assert (answer["kind"], answer["op_id"]) == ("cancelled", op_id)
    assert "denied by alice: wrong customer" in answer["reason"]
    assert done["messages"][-1].content == "Done: the credit is cancelled"
    again = ask(desk.effects, case, 25_000, "call_2", run=f"langgraph:{thread}")
    assert isinstance(again, EffectCancelled) and again.op_id == op_id
    assert again.reason == "denied by alice: wrong customer"
    handed_to_a_worker(desk, op_id)
    op = desk.ledger.get(op_id)  # cancelled (its fence raised by the cancel), never claimed
    assert (op.status, op.lease_owner, desk.ledger.history(op_id).attempts) == (
        Status.CANCELLED,
        None,
        (),
    )
    assert desk.ledger.approval(op_id).consumed_at is None
    assert (sent(desk, op_id), applied(desk, case)) == (0, 0)


def test_the_agents_identity_never_approves(
    desk: Desk, browsers: tuple[WebDriver, WebDriver]
) -> None:
    from selenium.webdriver.common.by import By

    case = "case-self"
    op_id = held(ask(desk.effects, case, 25_000, "call_1")).op_id
    held(ask(desk.effects, case, 25_000, "mcp:support-bot:7"))  # as the MCP gateway asks
    # in the console: signed in as "agent" (the agents' actor), its approval is refused
    d = browsers[0]
    open_approval(d, desk, op_id, "agent")
    d.find_element(By.ID, "approve").click()
    assert "never approves their own act" in after_decision(d)
    assert d.find_element(By.ID, "refusal-title").text == "refused"
    # and through the ledger, whoever asks to approve as an agent
    digest = desk.ledger.get(op_id).payload_digest
    for who, why in (
        ("agent", "never approves their own act"),  # the actor, though an operator here
        ("call_1", "is not an operator"),  # the asker's tool-call id
        ("support-bot", "is not an operator"),  # an MCP token's name
    ):
        with pytest.raises(NotAnApprover, match=why):
            desk.ledger.approve(op_id, operator=who, digest=digest)
    assert desk.ledger.approval(op_id).approved_by == ()
    handed_to_a_worker(desk, op_id)
    untouched(desk, op_id)


def test_two_operators_approving_at_once_send_it_once(
    desk: Desk, browsers: tuple[WebDriver, WebDriver]
) -> None:
    one = held(ask(desk.effects, "case-race-1", 25_000, "call_1")).op_id
    two = held(ask(desk.effects, "case-race-2", 250_000, "call_2")).op_id  # two approvers
    assert desk.ledger.approval(two).approvers_required == 2

    def at_once(op_id: str) -> list[str]:
        from selenium.webdriver.common.by import By

        for d, operator in zip(browsers, ("alice", "bob"), strict=True):
            open_approval(d, desk, op_id, operator)
        barrier = threading.Barrier(2)
        said = ["", ""]

        def approve(i: int) -> None:
            barrier.wait()
            try:
                browsers[i].find_element(By.ID, "approve").click()
                said[i] = after_decision(browsers[i])
            except Exception as exc:  # said, for the assertion to show
                page = browsers[i].find_element(By.TAG_NAME, "body").text
                said[i] = f"the browser failed ({exc!r}) on a page saying: {page[:500]}"

        threads = [threading.Thread(target=approve, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sorted(said, key=lambda s: "released" in s)

    refused, released = at_once(one)
    assert "is released and will be sent once" in released, released
    assert refused.startswith("already decided: "), refused  # the first one's approval won
    waiting, released = sorted(at_once(two), key=lambda s: "released" in s)
    assert "is released and will be sent once" in released, released
    assert "waits for 1 more approval(s)" in waiting, waiting
    for op_id in (one, two):
        confirmed(desk, op_id)
        handed_to_a_worker(desk, op_id)
        assert sent(desk, op_id) == 1
    assert (applied(desk, "case-race-1"), applied(desk, "case-race-2")) == (1, 1)
    assert len(desk.ledger.approval_decisions(one)) == 1
    assert sorted(desk.ledger.approval(two).approved_by) == ["alice", "bob"]
