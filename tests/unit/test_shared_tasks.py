"""opledger's tasks are shared tasks: an app of the user's own gets them too."""

from __future__ import annotations

import pytest
from celery import Celery

import opledger.tasks.app as tasks
from opledger.ledger import DatabaseUnavailable
from opledger.settings import NotConfigured, get_settings

NAMES = {
    "opledger.dispatch",
    "opledger.reconcile",
    "opledger.sweep",
    "opledger.relay",
    "opledger.purge_payloads",
    "opledger.notify_review",
    "opledger.notify_approval",
}


def test_the_tasks_attach_to_another_celery_app() -> None:
    theirs = Celery("theirs", set_as_current=False)

    @theirs.task(name="theirs.hello", shared=False)
    def hello() -> str:
        return "hi"

    theirs.finalize()
    assert NAMES | {"theirs.hello"} <= set(theirs.tasks)
    assert isinstance(theirs.tasks["opledger.dispatch"], tasks.OperationTask)
    assert set(tasks.app.tasks) >= NAMES


def test_only_a_transient_database_error_is_retried() -> None:
    task = tasks.app.tasks["opledger.dispatch"]
    assert task.autoretry_for == (DatabaseUnavailable,)
    assert task.retry_backoff and task.max_retries == 8


def test_an_operation_no_task_can_act_on_is_refused_not_retried() -> None:
    task = tasks.app.tasks["opledger.reconcile"]
    assert task("not-an-operation-id") == "refused"


def test_runtime_never_finds_or_starts_a_database_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPLEDGER_DATABASE_URL", raising=False)
    monkeypatch.setattr(tasks, "_runtime", None)
    get_settings.cache_clear()
    try:
        with pytest.raises(NotConfigured, match="OPLEDGER_DATABASE_URL is not set"):
            tasks.runtime()
    finally:
        get_settings.cache_clear()


@pytest.mark.parametrize(
    "name",
    [
        "opledger.dispatch",
        "opledger.reconcile",
        "opledger.notify_review",
        "opledger.notify_approval",
    ],
)
def test_wrong_arguments_are_refused_when_published_not_in_the_worker(name: str) -> None:
    """Celery checks a call's arguments against the task's signature before it publishes;
    the refusing wrapper keeps the real signature, so the check still works."""
    check = tasks.app.tasks[name].__header__
    check("op_01JAAAAAAAAAAAAAAAAAAAAAAA")
    with pytest.raises(TypeError):
        check("op_01JAAAAAAAAAAAAAAAAAAAAAAA", 1, 2, 3)
