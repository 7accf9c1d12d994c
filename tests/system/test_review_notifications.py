"""A review that opens notifies a webhook once: the notification is itself an operation."""

from __future__ import annotations

from typing import Any

import pytest

from opledger.dev.chaos.audit import audit
from opledger.dev.chaos.variants import KINDS, configure_sandbox
from opledger.dev.processes import Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.tasks.app import dispatch, notify_review
from tests.intents import key_of, prepare

from .conftest import settings_of, settled, worker_with

pytestmark = pytest.mark.system


def test_a_review_notifies_the_webhook_exactly_once(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    # Any, not str: unpacked into start_worker(), whose concurrency is an int
    hook: dict[str, Any] = {"OPLEDGER_REVIEW_WEBHOOK_URL": f"{sandbox.http_url}/webhook/reviews"}
    configure_sandbox(sandbox, settings_of({**running.env, **hook}))
    with worker_with(running, **hook):
        no_dedup = next(k for k in KINDS if k.name == "no-dedup")
        op_id = prepare(sys_ledger, "notify-me", action=no_dedup.action)
        sandbox.fault("crm", "drop_after_commit", key=key_of(sys_ledger, op_id))
        dispatch.delay(op_id)
        settled(sys_ledger, [op_id], timeout=30)
        review = sys_ledger.history(op_id).reviews[0]

        def deliveries() -> list[dict[str, object]]:
            effects = sandbox.truth()["effects"]
            return [{"key": k, "n": n} for k, n in effects.items() if k.startswith("webhook:")]

        wait_until(deliveries, 30, "the webhook delivery")
        for _ in range(3):  # a crash and redelivery of the notify task changes nothing
            notify_review.delay(op_id)
        wait_until(lambda: sys_ledger.history(op_id).reviews[0].notified_at, 10, "notified_at")
        notes = [
            o for o in sys_ledger.list(tenant="acme", limit=1000) if o.action == "webhook.post.v1"
        ]
        assert len(notes) == 1
        note = notes[0]
        assert (
            note.workflow_id == f"review:{op_id}"
            and note.intent_key == f"review-opened:{review.id}"
        )
        assert settled(sys_ledger, [note.id]) == {note.id: Status.CONFIRMED}
        assert note.idempotency_key.startswith("opk_")
        assert deliveries() == [{"key": f"webhook:{note.idempotency_key}", "n": 1}]
        payload = sys_ledger.payload(note.id)
        assert (
            payload is not None
            and payload["op_id"] == op_id
            and payload["event"] == "review.opened"
        )
        assert audit(sys_ledger, sandbox.truth(), [op_id]).clean
