"""The JSON log format: one object per line, with the operation's fields where they apply."""

from __future__ import annotations

import json
import logging

import pytest

from opledger.observability.logs import JsonFormatter, TaskContext
from opledger.settings import Settings, SettingsInvalid


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "opledger.worker", logging.WARNING, __file__, 1, "hi %s", ("x",), None
    )
    record.__dict__.update(extra)
    return record


def test_a_record_is_one_json_line_with_the_fields_it_has() -> None:
    line = JsonFormatter().format(_record(op_id="op_1", fence=3, attempt=2))
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "hi x" and parsed["level"] == "warning"
    assert (parsed["op_id"], parsed["fence"], parsed["attempt"]) == ("op_1", 3, 2)
    assert "decision" not in parsed and "tenant" not in parsed


def test_celerys_received_line_names_the_operation() -> None:
    op_id = "op_01M8Q0ZQGXWXDSZ6JAZXWAJ0H5"
    data = {"id": "t-1", "name": "opledger.dispatch", "args": f"('{op_id}',)"}
    record = _record(data=data)
    assert TaskContext().filter(record)
    assert (record.op_id, record.task_id) == (op_id, "t-1")  # type: ignore[attr-defined]


def test_the_log_format_is_text_or_json() -> None:
    assert Settings.from_environ({}).log_format == "text"
    assert Settings.from_environ({"OPLEDGER_LOG_FORMAT": "json"}).log_format == "json"
    with pytest.raises(SettingsInvalid, match="OPLEDGER_LOG_FORMAT"):
        Settings.from_environ({"OPLEDGER_LOG_FORMAT": "xml"})
