"""Inline dispatch on a real Postgres and a real CRM on loopback, with no worker running:
the agent's own thread claims under a fence, sends, records; a worker is published to
only when this process cannot finish (`opledger.agents.inline`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import text

from opledger.adapters.crm import CrmAdapter
from opledger.adapters.registry import Registry
from opledger.agents import EffectConfirmed, EffectPending, EffectResult, Effects, EffectUnknown
from opledger.agents import inline as inline_module
from opledger.agents.inline import Inline, from_setting
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Binding, Confirmed, InvalidInput, Ledger, Status
from opledger.ledger.intents import Intent

from .test_agents import Published


@pytest.fixture
def crm(sandbox: Sandbox) -> Iterator[CrmAdapter]:
    adapter = CrmAdapter(sandbox.http_url, account="acme")
    yield adapter
    adapter.close()


@pytest.fixture
def served(ledger: Ledger, crm: CrmAdapter) -> Ledger:
    """The ledger as an agent's process builds it with its adapters."""
    return Ledger(ledger.engine, actions=Registry([crm]))


def _close(effects: Effects, case: str = "case-318", **kw: Any) -> EffectResult:
    args: dict[str, Any] = {
        "tenant": "acme",
        "run": "onboarding-42",
        "action": "crm.close_case.v1",
        "target": case,
        "payload": {"note": "resolved"},
        "authorization_ref": "auth_acme",
    }
    return effects.effect(**{**args, **kw})


def _requests(sandbox: Sandbox, op: EffectResult) -> int:
    return len(sandbox.truth()["requests"].get(f"crm:{op.operation.idempotency_key}", []))


def test_an_inline_effect_is_claimed_sent_and_recorded_in_the_callers_thread(
    served: Ledger, grant: str, sandbox: Sandbox
) -> None:
    published = Published()
    effects = Effects(served, publish=published, inline=True)
    result = _close(effects, wait=10)
    assert isinstance(result, EffectConfirmed), result
    assert result.path == "inline"
    assert published == []  # no worker was asked
    assert _requests(sandbox, result) == 1
    attempts = served.history(result.op_id).attempts
    assert [a.owner.startswith("inline:") for a in attempts] == [True]
    assert result.operation.fence == 1
    # asked again (a re-asked model): the recorded operation, nothing sent, no path
    again = _close(effects, wait=10, asked_by="call_2")
    assert again.op_id == result.op_id and again.asked_before and again.path is None
    assert _requests(sandbox, result) == 1


def test_without_a_wait_the_inline_answer_is_the_outcome(
    served: Ledger, grant: str, sandbox: Sandbox
) -> None:
    effects = Effects(served, publish=Published(), inline=True)
    result = _close(effects)
    assert isinstance(result, EffectConfirmed) and result.path == "inline"


def test_asyncio_agents_dispatch_inline_off_the_event_loop(
    served: Ledger, grant: str, sandbox: Sandbox
) -> None:
    effects = Effects(served, publish=Published(), inline=True)
    sandbox.configure("acme", processing_s=1.0)  # each call holds its thread a second
    gaps: list[float] = []

    async def heartbeat() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.02)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async def agents() -> list[EffectResult]:
        beating = asyncio.create_task(heartbeat())
        try:
            return await asking()
        finally:
            beating.cancel()

    async def asking() -> list[EffectResult]:
        return list(
            await asyncio.gather(
                *(
                    effects.aeffect(
                        tenant="acme",
                        run="onboarding-42",
                        action="crm.close_case.v1",
                        target=f"case-{i}",
                        payload={"note": "resolved"},
                        authorization_ref="auth_acme",
                        wait=10,
                    )
                    for i in range(5)
                )
            )
        )

    results = asyncio.run(agents())
    assert all(isinstance(r, EffectConfirmed) and r.path == "inline" for r in results)
    assert sorted(sandbox.by_act().values()) == [1] * 5
    # the calls ran in threads: the loop kept ticking through each second-long call
    assert gaps and max(gaps) < 0.8, max(gaps)


def test_a_call_may_decline_and_a_deployment_may_name_its_actions(
    served: Ledger, grant: str, sandbox: Sandbox
) -> None:
    published = Published()
    effects = Effects(served, publish=published, inline=["email.*"])
    handed = _close(effects)  # not an email: a worker's
    assert isinstance(handed, EffectPending) and handed.path == "worker"
    assert published == [handed.op_id] and _requests(sandbox, handed) == 0
    asked = _close(effects, case="case-9", inline=True)  # the call asks for it
    assert isinstance(asked, EffectConfirmed) and asked.path == "inline"
    declined = Effects(served, publish=published, inline=True)
    result = _close(declined, case="case-10", inline=False)
    assert isinstance(result, EffectPending) and result.path == "worker"
    never = Effects(served, publish=published, inline=False)
    refused = _close(never, case="case-11", inline=True)  # a policy: never in this process
    assert isinstance(refused, EffectPending) and refused.path == "worker"


def test_an_action_no_adapter_here_serves_goes_to_a_worker_and_is_waited_on(
    ledger: Ledger, grant: str, sandbox: Sandbox, crm: CrmAdapter
) -> None:
    from opledger.adapters.email import EmailAdapter

    mail = EmailAdapter(sandbox.http_url, account="acme")
    published = Published()
    served = Ledger(ledger.engine, actions=Registry([crm, mail]))
    inline = Inline(Registry([crm]), publish_dispatch=published)  # this process: the CRM only
    effects = Effects(served, publish=published, inline=inline, poll=30.0)
    result = effects.effect(
        tenant="acme",
        run="onboarding-42",
        action="email.send.v1",
        target="owner@acme.test",
        payload={"to": "owner@acme.test", "subject": "Closed", "text": "done"},
        authorization_ref="auth_acme",
        wait=0.2,
    )
    mail.close()
    assert isinstance(result, EffectPending) and result.path == "worker"
    assert published == [result.op_id]
    with served.engine.connect() as conn:  # its settle wakes this process's waiters
        watched = conn.execute(
            text("SELECT notify_settle FROM operations WHERE id = :id"), {"id": result.op_id}
        ).scalar_one()
    assert watched is True


def test_an_ambiguous_inline_send_is_unknown_and_a_workers_reconcile_is_asked_at_once(
    served: Ledger, grant: str, sandbox: Sandbox, crm: CrmAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: dict[str, Published] = {}

    def recorded(task: str) -> Published:
        return asked.setdefault(task, Published())

    monkeypatch.setattr(inline_module, "_best_effort", recorded)
    effects = Effects(served, publish=Published(), inline=True)
    sandbox.fault("crm", "drop_after_commit")
    result = _close(effects, wait=0.5)
    assert isinstance(result, EffectUnknown) and result.path == "inline"
    assert result.operation.status is Status.UNKNOWN  # never "failed"
    assert sandbox.by_act() == {"crm:acme:close:case-318": 1}
    assert asked["opledger.reconcile"] == [result.op_id]


def test_at_most_concurrency_threads_dispatch_at_once(
    served: Ledger, grant: str, sandbox: Sandbox, crm: CrmAdapter
) -> None:
    inline = Inline(Registry([crm]), publish_dispatch=Published(), concurrency=2)
    effects = Effects(served, publish=Published(), inline=inline)
    sandbox.configure("acme", processing_s=0.2)  # each call takes a while
    started = time.monotonic()

    def one(i: int) -> EffectResult:
        return _close(effects, case=f"case-{i}", wait=10)

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(6)))
    assert all(isinstance(r, EffectConfirmed) for r in results)
    peak = sandbox.limited("acme")["max_in_flight"]
    assert peak == 2, peak  # six threads asked; two sent at a time
    assert time.monotonic() - started >= 0.6  # three rounds of two


def test_inline_needs_the_ledgers_adapters(ledger: Ledger) -> None:
    with pytest.raises(InvalidInput, match="adapters"):
        Effects(ledger, inline=True)
    assert Effects(ledger).inline is None  # the deployment's default: nothing to send here


def test_the_setting_reads_as_patterns() -> None:
    assert from_setting("off") == () and from_setting("") == ()
    assert from_setting("on") == ("*",)
    assert from_setting(" crm.* , email.send.v1 ") == ("crm.*", "email.send.v1")
    assert from_setting("never") is None


@pytest.mark.parametrize("case", ["case-318", "missing-7"])  # confirmed; rejected (no case)
def test_the_inline_answer_is_what_reading_the_ledger_answers(
    served: Ledger, grant: str, sandbox: Sandbox, case: str
) -> None:
    effects = Effects(served, publish=Published(), inline=True)
    result = _close(effects, case=case, wait=10)
    assert result.final and result.path == "inline"
    assert result.model_copy(update={"path": None}) == effects.result(result.op_id)
    if case == "case-318":
        assert isinstance(result, EffectConfirmed) and result.data  # the provider's document


def test_an_act_another_process_is_sending_is_waited_on_and_woken_by_its_settle(
    served: Ledger, grant: str, sandbox: Sandbox
) -> None:
    effects = Effects(served, publish=Published(), inline=True, poll=30.0)
    op = served.ask_intent(  # recorded elsewhere, nobody asked to be told when it settles
        Intent(
            tenant="acme",
            workflow_id="onboarding-42",
            action="crm.close_case.v1",
            target="case-318",
            payload={"note": "x"},
            authorization_ref="auth_acme",
        ),
        notify=False,
    ).operation
    claim = served.claim(op.id, owner="a-worker")  # and a worker is sending it
    assert claim is not None
    answers: list[EffectResult] = []
    waiting = threading.Thread(
        target=lambda: answers.append(_close(effects, payload={"note": "x"}, wait=20))
    )
    started = time.monotonic()
    waiting.start()
    deadline = time.monotonic() + 10
    while not _watched(served, op.id) and time.monotonic() < deadline:
        time.sleep(0.01)  # until the asker has asked to be told
    served.record_outcome(
        claim, Confirmed(receipt_id="r1", binding=Binding(idempotency_key=claim.idempotency_key))
    )
    waiting.join(25)
    assert len(answers) == 1 and isinstance(answers[0], EffectConfirmed), answers
    assert answers[0].asked_before and answers[0].path is None  # this call sent nothing
    assert time.monotonic() - started < 10  # woken by the settle, not by its 30 s poll


def _watched(ledger: Ledger, op_id: str) -> bool:
    with ledger.engine.connect() as conn:
        return bool(
            conn.execute(
                text("SELECT notify_settle FROM operations WHERE id = :id"), {"id": op_id}
            ).scalar_one()
        )


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Set OPLEDGER_ variables for this test; the settings are read again with them."""
    from opledger.settings import get_settings

    def setting(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(f"OPLEDGER_{name}", value)
        get_settings.cache_clear()

    yield setting
    monkeypatch.undo()
    get_settings.cache_clear()


def test_the_deployment_setting_opts_in_and_never_wins_over_the_code(
    served: Ledger, grant: str, sandbox: Sandbox, environ: Callable[..., None]
) -> None:
    environ(INLINE_DISPATCH="crm.*")
    result = _close(Effects(served, publish=Published()))
    assert isinstance(result, EffectConfirmed) and result.path == "inline"
    environ(INLINE_DISPATCH="never")  # a process that must not call providers
    published = Published()
    for inline in (True, ["crm.*"], Inline(Registry([]))):
        effects = Effects(served, publish=published, inline=inline)
        assert effects.inline is None
        handed = _close(effects, case="case-2", inline=True)
        assert isinstance(handed, EffectPending) and handed.path == "worker"
    assert sandbox.by_act().get("crm:acme:close:case-2") is None


def test_strict_mode_without_a_synchronous_standby_hands_every_act_to_a_worker(
    served: Ledger, grant: str, sandbox: Sandbox, environ: Callable[..., None]
) -> None:
    environ(REQUIRE_SYNC_STANDBY="true")  # the test server has no standby at all
    published = Published()
    result = _close(Effects(served, publish=published, inline=True))
    assert isinstance(result, EffectPending) and result.path == "worker"
    assert published == [result.op_id] and _requests(sandbox, result) == 0


def test_unreadable_settings_hand_every_act_to_a_worker(
    served: Ledger, grant: str, sandbox: Sandbox, environ: Callable[..., None]
) -> None:
    environ(LEASE_SECONDS="soon")
    effects = Effects(served, publish=Published(), inline=True)
    assert effects.inline is not None
    assert "cannot be read" in str(effects.inline.why_not(served, "crm.close_case.v1"))
    result = _close(effects)
    assert isinstance(result, EffectPending) and result.path == "worker"


def test_a_settled_inline_act_is_answered_without_reading_it_back(
    served: Ledger, grant: str, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    effects = Effects(served, publish=Published(), inline=True)
    reads: list[str] = []
    answer = served.answer

    def read(op_id: str) -> Any:
        reads.append(op_id)
        return answer(op_id)

    monkeypatch.setattr(served, "answer", read)
    result = _close(effects, wait=10)
    assert isinstance(result, EffectConfirmed) and reads == []
