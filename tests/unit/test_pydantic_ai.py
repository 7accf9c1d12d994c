"""The run and the asker of a Pydantic AI tool call (`opledger.agents.pydantic_ai`), without
a database: a durable workflow's id, a run you name, or a typed refusal; never the per-run
or per-call id."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import RunContext
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RunUsage

from opledger.agents import pydantic_ai as pai


def _ctx(**kw: Any) -> RunContext[Any]:
    return RunContext(deps=None, model=TestModel(), usage=RunUsage(), **kw)


def _engine(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> None:
    monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))


def test_outside_a_durable_workflow_a_run_must_be_named() -> None:
    ctx = _ctx(run_id="01j-run", conversation_id="c-1", tool_call_id="call_1", tool_name="t")
    assert pai.durable_run() is None
    with pytest.raises(pai.UnnamedRun, match="'01j-run' is new on every agent run"):
        pai.run_of(ctx)
    assert pai.conversation_run(ctx) == "pydantic-ai:conversation:c-1"
    with pytest.raises(pai.UnnamedRun):
        pai.conversation_run(_ctx())


def test_a_dbos_or_temporal_workflow_is_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _ctx(run_id="01j-run")
    info = types.SimpleNamespace(workflow_id="wf-t", run_id="temporal-run-2")
    _engine(monkeypatch, "temporalio.workflow", in_workflow=lambda: True, info=lambda: info)
    assert pai.run_of(ctx) == "temporal:wf-t"  # the workflow's id, not its run's
    _engine(monkeypatch, "temporalio.activity", in_activity=lambda: True, info=lambda: info)
    assert pai.run_of(ctx) == "temporal:wf-t"
    outside = types.SimpleNamespace(workflow_id=None)
    _engine(monkeypatch, "dbos", DBOS=outside)
    assert pai.run_of(ctx) == "temporal:wf-t"
    _engine(monkeypatch, "dbos", DBOS=types.SimpleNamespace(workflow_id="wf-d"))
    assert pai.run_of(ctx) == "dbos:wf-d"


def test_the_call_id_is_kept_as_who_asked() -> None:
    assert pai.asker_of(_ctx(tool_call_id="call_9", tool_name="refund")) == "refund:call_9"
    assert pai.asker_of(_ctx(tool_call_id="call\n9", tool_name="refund")) == "refund:call?9"
    assert pai.asker_of(_ctx(tool_name="refund")) == "refund"


def test_a_repeatable_tool_needs_its_repeat_argument_free() -> None:
    class Args(BaseModel):
        repeat: int

    options: dict[str, Any] = {
        "name": "t",
        "description": "d",
        "args_schema": Args,
        "tenant": "acme",
        "action": "crm.close_case.v1",
        "authorization_ref": "auth_acme",
        "effect_of": lambda a: ("x", {}),
    }
    with pytest.raises(ValueError, match="repeatable=False"):
        pai.effect_tool(None, **options)  # type: ignore[arg-type]
    tool = pai.effect_tool(None, repeatable=False, **options)  # type: ignore[arg-type]
    assert set(tool.tool_def.parameters_json_schema["properties"]) == {"repeat"}


def test_a_standalone_temporal_activity_has_no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # an activity started by a client, not by a workflow: its info has no workflow id
    info = types.SimpleNamespace(workflow_id=None, activity_id="act-1")
    _engine(monkeypatch, "temporalio.activity", in_activity=lambda: True, info=lambda: info)
    assert pai.durable_run() is None
    with pytest.raises(pai.UnnamedRun):
        pai.run_of(_ctx(run_id="01j-run"))
    _engine(monkeypatch, "temporalio.activity", in_activity=lambda: False)
    _engine(monkeypatch, "temporalio.workflow", in_workflow=lambda: True, info=lambda: info)
    assert pai.durable_run() is None


def test_pydantic_ais_own_tool_options_are_passed_and_a_typo_is_refused() -> None:
    class Args(BaseModel):
        case_id: str

    options: dict[str, Any] = {
        "name": "close",
        "description": "Close a case",
        "args_schema": Args,
        "tenant": "acme",
        "action": "crm.close_case.v1",
        "authorization_ref": "auth_acme",
        "effect_of": lambda a: (a["case_id"], {}),
    }
    tool = pai.effect_tool(
        None,  # type: ignore[arg-type]
        requires_approval=True,
        strict=True,
        max_retries=4,
        sequential=True,
        timeout=12.5,
        metadata={"team": "support"},
        **options,
    )
    assert (tool.requires_approval, tool.strict, tool.max_retries) == (True, True, 4)
    assert (tool.sequential, tool.timeout, tool.metadata) == (True, 12.5, {"team": "support"})
    assert tool.tool_def.kind == "unapproved" and tool.tool_def.strict is True
    for wrong in ("require_approval", "function_schema", "takes_ctx"):
        with pytest.raises(TypeError, match=wrong):
            pai.effect_tool(None, **{wrong: True}, **options)  # type: ignore[arg-type]
