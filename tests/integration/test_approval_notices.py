"""An approval request is notified once, on a real Postgres: the sweep hands out each
pending request not yet notified, and `notify_approval` prepares its `approval.requested`
notification, an operation of its own keyed by the held operation, so a trigger run twice
(a redelivery, a crash before it was marked) never makes a second one. Its body hides what
looks like a secret and carries no payload; without a webhook nothing is prepared and the
request is marked; a request decided meanwhile, or a notification's own, is never
notified. A receiver on loopback gets exactly one signed POST, which it verifies."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pydantic import SecretStr
from sqlalchemy import text

from examples.verify_webhook import BadSignature, verify
from opledger.adapters.registry import Registry
from opledger.adapters.stripe import StripeAdapter
from opledger.adapters.webhook import WebhookAdapter, webhook_contract
from opledger.console.accounts import Accounts
from opledger.console.approvals import approval_url
from opledger.ledger import Ledger, Operation, Status
from opledger.settings import Settings
from opledger.signatures import HEADER
from opledger.tasks import app as tasks
from opledger.tasks.notices import notify_approval
from opledger.tasks.worker import Worker
from tests.posts import receiving

REFUND, NOTIFY = "stripe.refund.v1", "webhook.post.v1"
#: a refund above 10000, or of a target that looks like an API key, asks one person
POLICY = {"when": [{"field": "amount", "above": 10000}, {"target_matches": "sk_*"}]}
SECRET = "s" * 24 + "-approval-notices-001"
KEYLIKE = "sk_test_4eC39HqLyjWDarjtT1"
HIDDEN_KEY = "[hidden API key: text, 26 characters]"
HOUR = timedelta(hours=1)
WEBHOOKS_DOC = Path(__file__).resolve().parents[2] / "docs" / "webhooks.md"


@dataclass
class Receiver:
    """A webhook receiver on loopback: each request kept, answered 204 when docs/webhooks.md's
    `verify` accepts its signature with `SECRET`, else 401."""

    url: str = ""
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    verified: list[int] = field(default_factory=list)

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        self.requests.append((headers, body))
        try:
            self.verified.append(verify(body, headers.get(HEADER.lower(), ""), [SECRET]))
        except BadSignature:
            return 401
        return 204


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()
    with receiving(state.handle, "/hooks/approvals") as state.url:
        yield state


@pytest.fixture
def approving(ledger: Ledger) -> Iterator[Callable[..., Ledger]]:
    """A ledger whose registry serves refunds under `POLICY` and the webhook (to `url`,
    signed with `SECRET`); acme's grant `auth_s` covers Stripe; alice approves its acts."""
    ledger.grant(tenant="acme", scope=["stripe.*"], granted_by="test", ref="auth_s")
    Accounts(ledger.engine).add(
        "alice", tenants=["acme"], password=None, by="test", approves=["stripe.*"]
    )
    hooks: list[WebhookAdapter] = []

    def make(url: str = "http://127.0.0.1:9/hooks", **policies: Any) -> Ledger:
        hook = WebhookAdapter(
            url,
            contract=webhook_contract(request_timeout=timedelta(seconds=5)),
            secrets=[SecretStr(SECRET)],
        )
        hooks.append(hook)
        registry = Registry([StripeAdapter("http://127.0.0.1:9", api_key="sk_test_123"), hook])
        for action, policy in {REFUND: POLICY, **policies}.items():
            registry.require_approval(action, policy)
        return Ledger(ledger.engine, actions=registry)

    yield make
    for hook in hooks:
        hook.close()


def refund(ledger: Ledger, amount: int, *, target: str = "ch_1", key: str = "r-1") -> Operation:
    return ledger.prepare(
        tenant="acme",
        workflow_id="run-1",
        intent_key=key,
        action=REFUND,
        target=target,
        payload={"amount": amount, "reason": "duplicate"},
        authorization_ref="auth_s",
        actor="agent",
    )


def notify(ledger: Ledger, op_id: str, url: str | None = "https://hooks.test/x") -> list[str]:
    """`notify_approval` of `op_id`: what it did, then what it handed to dispatch."""
    dispatched: list[str] = []
    done = notify_approval(ledger, op_id, webhook_url=url, dispatch=dispatched.append)
    return [done, *dispatched]


def notes(ledger: Ledger) -> list[Operation]:
    return [o for o in ledger.list(tenant="acme", limit=1000) if o.action == NOTIFY]


def notified_at(ledger: Ledger, op_id: str) -> Any:
    with ledger.engine.connect() as conn:
        return conn.execute(
            text("SELECT notified_at FROM approvals WHERE op_id = :id"), {"id": op_id}
        ).scalar_one()


def due(ledger: Ledger, backoff: timedelta = HOUR) -> list[str]:
    return ledger.due_approval_notifications(backoff=backoff)


def test_a_request_is_notified_once_even_when_the_trigger_runs_twice(
    approving: Callable[..., Ledger],
) -> None:
    ledger = approving()
    small, big = refund(ledger, 500), refund(ledger, 25_000, key="r-2")
    assert due(ledger) == [big.id]  # the act held for approval only
    assert due(ledger) == []  # handed out once per backoff
    first, second = notify(ledger, big.id), notify(ledger, big.id)  # a redelivery
    assert first[0] == second[0] == "prepared"
    [note] = notes(ledger)
    assert first[1:] == second[1:] == [note.id]
    assert note.workflow_id == f"approval:{big.id}"
    assert note.intent_key == f"approval-requested:{big.id}"
    assert note.status is Status.PREPARED and note.waiting_on == 0  # never held itself
    assert notified_at(ledger, big.id) is not None
    assert due(ledger, timedelta(0)) == []  # marked: never handed out again
    # a crash after the notification was prepared, before the request was marked
    with ledger.engine.begin() as conn:
        conn.execute(
            text("UPDATE approvals SET notified_at = NULL, notify_due_at = NULL WHERE op_id = :id"),
            {"id": big.id},
        )
    assert due(ledger) == [big.id]
    assert notify(ledger, big.id) == ["prepared", note.id]  # the same notification
    assert [n.id for n in notes(ledger)] == [note.id]
    assert notify(ledger, small.id) == ["noop"]  # nothing asked of anyone


def test_the_body_hides_secrets_and_carries_no_payload(approving: Callable[..., Ledger]) -> None:
    ledger = approving()
    op = refund(ledger, 25_000, target=KEYLIKE)
    approval = ledger.approval(op.id)
    notify(ledger, op.id)
    [note] = notes(ledger)
    body = ledger.payload(note.id)
    assert body == {
        "event": "approval.requested",
        "op_id": op.id,
        "tenant": "acme",
        "action": REFUND,
        "target": HIDDEN_KEY,
        "reasons": ["amount 25000 is above 10000", f"target '{HIDDEN_KEY}' matches 'sk_*'"],
        "approvers_required": 1,
        "requested_by": "agent",
        "requested_at": approval.requested_at.isoformat(),
        "expires_at": approval.expires_at.isoformat(),
        "payload_digest": op.payload_digest,
        "console_path": approval_url("acme", op.id),
    }
    assert KEYLIKE not in json.dumps(body)


def test_the_docs_show_the_body_as_it_is(approving: Callable[..., Ledger]) -> None:
    """docs/webhooks.md's `approval.requested` example has exactly the real body's fields."""
    [shown] = [
        json.loads(block)
        for block in re.findall(r"^```json\n(.*?)^```$", WEBHOOKS_DOC.read_text(), re.M | re.S)
        if '"approval.requested"' in block
    ]
    ledger = approving()
    op = refund(ledger, 25_000)
    notify(ledger, op.id)
    [note] = notes(ledger)
    body = ledger.payload(note.id)
    assert body is not None and sorted(shown) == sorted(body)
    assert shown["console_path"] == approval_url(shown["tenant"], shown["op_id"])
    assert {k: type(v) for k, v in shown.items()} == {k: type(v) for k, v in body.items()}


def test_without_a_webhook_nothing_is_prepared_and_the_request_is_marked(
    approving: Callable[..., Ledger],
) -> None:
    ledger = approving()
    op = refund(ledger, 25_000)
    assert notify(ledger, op.id, url=None) == ["skipped"]
    assert notes(ledger) == []
    assert notified_at(ledger, op.id) is not None
    assert due(ledger, timedelta(0)) == []


def test_a_request_decided_before_its_notice_is_not_notified(
    approving: Callable[..., Ledger],
) -> None:
    ledger = approving()
    op = refund(ledger, 25_000)
    assert due(ledger) == [op.id]
    ledger.approve(op.id, operator="alice", digest=op.payload_digest)
    assert notify(ledger, op.id) == ["noop"]
    assert notes(ledger) == [] and notified_at(ledger, op.id) is not None
    denied = refund(ledger, 30_000, key="r-3")
    ledger.deny(denied.id, operator="alice", digest=denied.payload_digest, note="no")
    assert due(ledger) == []  # decided before any sweep: never handed out
    cancelled = refund(ledger, 40_000, key="r-4")
    ledger.cancel(cancelled.id, reason="the run was stopped")
    assert ledger.approval(cancelled.id).status == "pending"  # until it expires
    assert due(ledger) == []  # its act no longer waits for anyone
    assert notify(ledger, cancelled.id) == ["noop"]


def test_a_notifications_own_approval_is_never_notified(approving: Callable[..., Ledger]) -> None:
    """Even were a deployment to ask a person about webhooks, no notification notifies of
    another one."""
    ledger = approving(**{NOTIFY: "always"})
    ledger.grant(tenant="acme", scope=["webhook.*"], granted_by="test", ref="auth_w")
    hook = ledger.prepare(
        tenant="acme",
        workflow_id="run-1",
        intent_key="w-1",
        action=NOTIFY,
        target="somewhere",
        payload={"event": "test"},
        authorization_ref="auth_w",
    )
    assert ledger.approval(hook.id).status == "pending"
    assert due(ledger) == [hook.id]
    assert notify(ledger, hook.id) == ["skipped"]
    assert [n.id for n in notes(ledger)] == [hook.id]


def test_the_sweep_and_the_task_hand_it_to_dispatch(
    approving: Callable[..., Ledger], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """beat's sweep publishes `opledger.notify_approval` for the request; the task prepares
    the notice where review notices go (OPLEDGER_REVIEW_WEBHOOK_URL) and publishes it."""
    ledger = approving()
    op = refund(ledger, 25_000)
    settings = Settings.from_environ(
        {"OPLEDGER_DATABASE_URL": database_url, "OPLEDGER_REVIEW_WEBHOOK_URL": "https://h.test"}
    )
    rt = tasks.Runtime(settings=settings, ledger=ledger, registry=Registry(), owner=tasks._owner())
    published: dict[str, list[str]] = {}

    def sibling(task: Any, name: str) -> Any:
        return SimpleNamespace(delay=published.setdefault(name, []).append)

    monkeypatch.setattr(tasks, "_runtime", rt)
    monkeypatch.setattr(tasks, "_sibling", sibling)
    handed = tasks._hand_out_notifications(None, rt, HOUR, HOUR)  # type: ignore[arg-type]
    assert handed == {"notify": 0, "notify_approvals": 1}
    assert published == {"opledger.notify_approval": [op.id]}
    assert tasks.app.tasks["opledger.notify_approval"](op.id) == "prepared"
    [note] = notes(ledger)
    assert published["opledger.dispatch"] == [note.id]


def test_a_receiver_gets_exactly_one_signed_post(
    approving: Callable[..., Ledger], receiver: Receiver
) -> None:
    ledger = approving(receiver.url)
    worker = Worker(ledger, cast(Registry, ledger.actions), owner="w1")
    op = refund(ledger, 25_000)
    for _ in range(2):  # a redelivered notify task, and its dispatch again
        [_, note_id] = notify(ledger, op.id, url=receiver.url)
        worker.dispatch(note_id)
    assert ledger.get(note_id).status is Status.CONFIRMED
    [(headers, body)] = receiver.requests
    assert len(receiver.verified) == 1  # the signature verified with the shared secret
    assert headers["idempotency-key"] == ledger.get(note_id).idempotency_key
    sent = json.loads(body)
    assert sent["event"] == "approval.requested" and sent["op_id"] == op.id
    assert sent["payload_digest"] == op.payload_digest
    assert ledger.get(op.id).status is Status.PREPARED  # the approval is not the webhook's
