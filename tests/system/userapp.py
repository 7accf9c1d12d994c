"""A Celery app of a user's own, with a task of its own, and opledger's tasks registered
on it: what `tests/system/test_user_app.py` runs in a real worker process
(`celery -A tests.system.userapp worker`)."""

from __future__ import annotations

import os

from celery import Celery

import opledger.tasks

app = Celery("theirs", broker=os.environ["OPLEDGER_BROKER_URL"])
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_reject_on_worker_lost=False,
    task_serializer="json",
    accept_content=["json"],
    task_time_limit=60,
    broker_transport_options={"visibility_timeout": 600},
    task_ignore_result=True,
    worker_hijack_root_logger=False,
)


@app.task(name="theirs.close_case")
def close_case(case: str) -> str:
    """Their own task: records the intent in the ledger and hands it to opledger."""
    from opledger.tasks.app import dispatch, runtime

    op = runtime().ledger.prepare(
        tenant="acme",
        workflow_id="their-app",
        intent_key=f"close-{case}",
        action="crm.close_case.v1",
        target=case,
        payload={"note": "closed by their app"},
        authorization_ref="auth_acme",
    )
    dispatch.delay(op.id)  # published through this app (the current one), routed by it
    return op.id


opledger.tasks.register(app)
