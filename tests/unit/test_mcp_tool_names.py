"""The gateway's tool names are function names a model API accepts
(`^[a-zA-Z0-9_-]{1,64}$`: OpenAI's, Anthropic's alike), since hosts pass MCP tool names to the
model as they are: each one maps back to one action, the same on every start, and two
actions that would share a name stop the gateway at start, naming both."""

from __future__ import annotations

import hashlib
from typing import Any, cast

import pytest

from opledger.adapters.crm import CrmAdapter
from opledger.adapters.email import EmailAdapter
from opledger.adapters.registry import Registry
from opledger.ledger import InvalidInput
from opledger.mcp.server import Gateway
from opledger.mcp.tools import (
    ACTION_META,
    STATUS_TOOL,
    TOOL_NAME_RE,
    ToolNameClash,
    tool_name,
    tool_names,
)


def test_an_actions_tool_is_its_name_with_underscores_and_the_status_tool_fits_too() -> None:
    assert tool_name("crm.close_case.v1") == "crm_close_case_v1"
    assert STATUS_TOOL == "opledger_status"
    assert TOOL_NAME_RE.fullmatch(STATUS_TOOL)


def test_a_name_longer_than_64_is_shortened_the_same_way_every_time() -> None:
    long = "crm." + "a" * 70 + ".v1"
    name = tool_name(long)
    assert len(name) == 64 and TOOL_NAME_RE.fullmatch(name)
    assert name == tool_name(long)  # every replica, every restart
    assert name.endswith("_" + hashlib.sha256(long.encode()).hexdigest()[:8])
    # two long actions alike in their first 55 characters are two tools
    other = "crm." + "a" * 70 + ".v2"
    assert tool_name(other) != name and len(tool_name(other)) == 64
    assert tool_names([long, other]) == {name: long, tool_name(other): other}
    # the longest action the ledger takes (120 characters) fits too
    assert len(tool_name("a." + "b" * 115 + ".v1")) == 64


def test_two_actions_that_would_be_one_tool_are_refused_naming_both() -> None:
    with pytest.raises(ToolNameClash) as caught:
        tool_names(["crm.a_b.v1", "crm.close_case.v1", "crm_a.b.v1"])
    assert caught.value.actions == ("crm.a_b.v1", "crm_a.b.v1")
    assert caught.value.tool == "crm_a_b_v1"
    assert "crm.a_b.v1 and crm_a.b.v1" in str(caught.value)
    assert isinstance(caught.value, InvalidInput)  # the CLI's refusal at start (exit 3)


def test_the_gateway_refuses_to_start_with_two_actions_of_one_name() -> None:
    with pytest.raises(ToolNameClash, match=r"crm\.a_b\.v1 and crm_a\.b\.v1"):
        Gateway(
            cast(Any, None),
            cast(Any, None),
            cast(Any, None),
            wait=0,
            actions=["crm.a_b.v1", "crm_a.b.v1"],
        )


def test_each_tool_names_its_action_where_a_reader_looks() -> None:
    registry = Registry(
        [
            CrmAdapter("http://127.0.0.1:9", account="acme"),
            EmailAdapter("http://127.0.0.1:9", account="acme"),
        ]
    )
    gateway = Gateway(cast(Any, None), registry, cast(Any, None), wait=0)
    tools = {t.name: t for t in gateway.tools}
    assert set(tools) == {
        "crm_close_case_v1",
        "crm_update_case_v1",
        "email_send_v1",
        STATUS_TOOL,
    }
    assert all(TOOL_NAME_RE.fullmatch(name) for name in tools)
    close = tools["crm_close_case_v1"]
    assert close.meta == {ACTION_META: "crm.close_case.v1"}
    assert close.title == "crm.close_case.v1"
    assert "(Action crm.close_case.v1.)" in (close.description or "")
    assert STATUS_TOOL in (close.description or "")  # where a pending answer is followed
