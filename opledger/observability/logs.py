"""Structured logs: one JSON object per line when `OPLEDGER_LOG_FORMAT=json`.

Each line carries `ts`, `level`, `logger`, `message`, `pid` and, where they apply,
`op_id`, `tenant`, `action`, `fence`, `attempt`, `decision` and `task_id`: a log call
passes what it knows in `extra=`, and inside a Celery task the task's id and (for the
tasks that take one) its operation id are added when the line is formatted — so Celery's
own "received" and "succeeded" lines of a dispatch name the operation too, at no cost to a
task that logs nothing. Human-readable (Celery's own format) otherwise.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

#: the fields an opledger log line carries where they apply
FIELDS = ("op_id", "tenant", "action", "fence", "attempt", "decision", "task_id")
#: tasks whose first argument is an operation id
OPERATION_TASKS = frozenset(
    {
        "opledger.dispatch",
        "opledger.reconcile",
        "opledger.notify_review",
        "opledger.notify_approval",
    }
)
_OP_ID = re.compile(r"op_[0-9A-Za-z]{26}")


class TaskContext(logging.Filter):
    """Adds the running Celery task's id and operation id to a record that lacks them."""

    def filter(self, record: logging.LogRecord) -> bool:
        from celery._state import get_current_task

        data = getattr(record, "data", None)
        if isinstance(data, dict) and data.get("name") in OPERATION_TASKS:
            # Celery's "Task ... received" line, logged by the worker's main process
            if getattr(record, "task_id", None) is None:
                record.task_id = data.get("id")
            found = _OP_ID.search(str(data.get("args", "")))
            if found and getattr(record, "op_id", None) is None:
                record.op_id = found.group(0)
        task = get_current_task()
        if task is None:
            return True
        request = task.request
        if getattr(record, "task_id", None) is None and request.id:
            record.task_id = request.id
        if getattr(record, "op_id", None) is None and task.name in OPERATION_TASKS:
            args = request.args or ()
            if args and isinstance(args[0], str):
                record.op_id = args[0]
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_json(level: int | str = logging.INFO) -> None:
    """Send every record of this process to stderr as JSON lines (replacing the root's
    handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(TaskContext())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def install(log_format: str) -> None:
    """In JSON mode, take over Celery's logging set-up (its `setup_logging` signal: Celery
    then configures nothing itself) in every process that imports opledger's tasks."""
    if log_format != "json":
        return
    from celery.signals import setup_logging

    def _setup(loglevel: Any = None, **_: Any) -> None:
        configure_json(loglevel or logging.INFO)

    setup_logging.connect(_setup, weak=False)
