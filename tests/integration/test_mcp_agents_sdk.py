"""The OpenAI Agents SDK's own MCP client (`MCPServerStreamableHttp`) in front of the gateway,
as an agent uses it: the SDK lists the gateway's tools and hands them to the model under
their MCP names (it does unless `include_server_in_tool_names`), so each must be a function
name the model API accepts — the model here refuses any other, as OpenAI's API does, before
it answers. The run goes in `_meta` through the SDK's `tool_meta_resolver`, from the run's
context: the same agent run again with the same context is answered with the operation the
first run recorded. Over real streamable HTTP on the real ledger; no worker runs here.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from agents import Agent, ModelResponse, Runner, Usage, set_tracing_disabled
from agents.mcp import MCPServerStreamableHttp, MCPToolMetaContext
from agents.models.interface import Model
from agents.testing import assistant_message, function_call

from opledger.adapters.crm import CrmAdapter
from opledger.adapters.registry import Registry
from opledger.agents.effects import Effects
from opledger.ledger import Ledger
from opledger.mcp.clients import Caller, Clients, add_client
from opledger.mcp.server import Gateway, identify_by_token
from opledger.mcp.tools import RUN_META
from tests.integration.test_mcp_gateway import serving

pytestmark = pytest.mark.timeout(120)

#: what OpenAI's API (and Anthropic's) accepts as a function's name
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
UPDATE = "crm_update_case_v1"
ARGS = '{"target": "case-77", "payload": {"fields": {"priority": "high"}}}'


class BadRequest(Exception):
    """What the model API answers a request whose tool names it cannot take."""


class ApiLikeModel(Model):
    """A model that calls the gateway's update tool in its first turn, then is done; the
    tools it is sent are checked as the model API checks them."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.outputs: list[str] = []

    async def get_response(
        self,
        system_instructions: Any,
        input: Any,
        model_settings: Any,
        tools: list[Any],
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        self.seen = [t.name for t in tools]
        wrong = [name for name in self.seen if not FUNCTION_NAME.fullmatch(name)]
        if wrong:
            raise BadRequest(f"Invalid 'tools[].function.name': {wrong}")
        if not isinstance(input, str) and input[-1].get("type") == "function_call_output":
            self.outputs.append(str(input[-1]["output"]))
            return ModelResponse(
                output=[assistant_message("done")], usage=Usage(), response_id=None
            )
        call = function_call(UPDATE, ARGS, call_id=f"call_{uuid.uuid4().hex[:8]}")
        return ModelResponse(output=[call], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@dataclass
class Served:
    url: str
    token: str
    ledger: Ledger


@pytest.fixture
def served(ledger: Ledger, grant: str, tmp_path: Path) -> Iterator[Served]:
    registry = Registry([CrmAdapter("http://127.0.0.1:9", account="acme")])
    path = tmp_path / "clients.json"
    token = add_client(path, Caller("support", "acme", grant))
    effects = Effects(Ledger(ledger.engine, actions=registry), publish=lambda _op: None)
    gateway = Gateway(effects, registry, identify_by_token, wait=0.2)
    with serving(gateway, Clients(path)) as url:
        yield Served(url, token, ledger)


def run_meta(context: MCPToolMetaContext) -> dict[str, Any]:
    """The run of the call: the conversation the agent's run context names."""
    return {RUN_META: context.run_context.context["conversation"]}


def test_the_agents_sdk_lists_the_gateways_tools_for_the_model_and_calls_one_once(
    served: Served,
) -> None:
    set_tracing_disabled(True)
    model = ApiLikeModel()

    async def conversation() -> str:
        server = MCPServerStreamableHttp(
            {"url": served.url, "headers": {"Authorization": f"Bearer {served.token}"}},
            tool_meta_resolver=run_meta,
            use_structured_content=True,
        )
        async with server:
            agent = Agent(name="support", model=model, mcp_servers=[server])
            done = await Runner.run(agent, "raise case-77", context={"conversation": "conv-9"})
        return str(done.final_output)

    assert anyio.run(conversation) == "done"
    assert set(model.seen) == {"crm_close_case_v1", UPDATE, "opledger_status"}
    ops = served.ledger.list(limit=10)
    assert [(op.action, op.workflow_id) for op in ops] == [
        ("crm.update_case.v1", "mcp:support:conv-9")
    ]
    assert anyio.run(conversation) == "done"  # the conversation resumed, the tool called again
    assert [op.id for op in served.ledger.list(limit=10)] == [ops[0].id]
    first, again = model.outputs
    assert ops[0].id in first and '"asked_before": true' in again
