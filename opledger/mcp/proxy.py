"""`opledger mcp proxy`: an existing MCP server's tools, its effects caused once.

In front of the upstream (`OPLEDGER_MCP_UPSTREAM`, see `adapters.mcp`), the proxy offers the
tools its file names, with the upstream's own names (theirs, as its hosts know them: not
renamed as the gateway's tools are), descriptions and input schemas:
a passthrough (read-only) tool is forwarded as it is; a call of an effectful tool becomes
an effect of the caller's run — its arguments are the frozen payload, its target the
argument the file names — dispatched to the upstream by the workers (`McpToolAdapter`),
so asked again, it answers with the operation it recorded. Callers, runs and answers are
the gateway's (`server.Gateway`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INTERNAL_ERROR

from opledger.adapters.mcp import Upstream, UpstreamInvalid, UpstreamTool, connect
from opledger.adapters.registry import Registry
from opledger.agents.answers import REPEAT, REPEAT_HELP
from opledger.agents.effects import Effects

from .server import EFFECT_ANNOTATIONS, Gateway, Identify, refusal
from .tools import ACTION_META, LEGACY_STATUS_TOOL, STATUS_TOOL, TOOL_NAME_RE

log = logging.getLogger(__name__)


async def upstream_tools(upstream: Upstream) -> list[types.Tool]:
    """The upstream's tools, as its `tools/list` gives them."""
    async with connect(upstream) as client:
        listed = await client.list_tools()
    return list(listed.tools)


class Proxy(Gateway):
    """The upstream's named tools: effects through the ledger, the rest forwarded."""

    def __init__(
        self,
        effects: Effects,
        registry: Registry,
        identify: Identify,
        *,
        wait: float,
        upstream: Upstream,
        tools: list[types.Tool],
    ) -> None:
        super().__init__(effects, registry, identify, wait=wait, actions=())
        self.upstream = upstream
        by_name = {t.name: t for t in tools}
        missing = sorted({*upstream.effects, *upstream.passthrough} - set(by_name))
        if missing:
            raise UpstreamInvalid(f"the upstream offers no tool {', '.join(missing)}")
        unserved = sorted(
            t.action for t in upstream.effects.values() if t.action not in registry.actions
        )
        if unserved:
            raise UpstreamInvalid(
                f"no adapter serves {', '.join(unserved)}: run the proxy and the workers with "
                "OPLEDGER_ADAPTERS=opledger.adapters.mcp:build_registry"
            )
        _check_names([*upstream.passthrough, *upstream.effects])
        self._effectful: dict[str, UpstreamTool] = dict(upstream.effects)
        self._passthrough = set(upstream.passthrough)
        for name in sorted(self._passthrough):
            self.offer(by_name[name], effect=False)
        for name, spec in upstream.effects.items():
            schema = _with_repeat(name, by_name[name].input_schema)
            self.offer(_effect_tool(by_name[name], schema, spec))

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name in self._passthrough:
            self.identify()
            return await self._forward(params.name, dict(params.arguments or {}))
        return await super().call_tool(ctx, params)  # an effect, the status tool, or none

    def act_of(
        self, name: str, args: dict[str, Any]
    ) -> tuple[str, str, dict[str, Any], int | None] | types.CallToolResult:
        """The upstream tool's arguments are the payload; the file names the one that says
        what the act is done to."""
        spec = self._effectful[name]
        repeat = args.pop(REPEAT, None)
        target = name if spec.target is None else args.get(spec.target)
        if not isinstance(target, str | int) or isinstance(target, bool) or target == "":
            return refusal(
                name, "InvalidArguments", f"{spec.target} (what the act is done to) is missing"
            )
        return spec.action, str(target), args, repeat

    async def _forward(self, name: str, args: dict[str, Any]) -> types.CallToolResult:
        try:
            async with connect(self.upstream) as client:
                return await client.call_tool(name, args)
        except MCPError:
            raise
        except Exception as exc:
            raise MCPError(INTERNAL_ERROR, f"the upstream did not answer: {exc}"[:500]) from None


def _check_names(names: list[str]) -> None:
    """The upstream's tools keep their own names (its hosts, and the upstream file, know them
    by these). One named as the status tool is refused; one a model API would refuse as a
    function name is offered with a warning: hosts that pass tool names to the model as they
    are fail on it (rename it upstream, or prefix it in the host)."""
    for name in names:
        if name in (STATUS_TOOL, LEGACY_STATUS_TOOL):
            raise UpstreamInvalid(
                f"the upstream tool {name} has the name of the proxy's status tool: leave it "
                "out of the upstream file"
            )
        if not TOOL_NAME_RE.fullmatch(name):
            log.warning(
                "the upstream tool %r is not named as model APIs name a function "
                "(^[a-zA-Z0-9_-]{1,64}$): hosts that pass its name to the model will fail",
                name,
            )


def _with_repeat(name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(schema))
    props = out.setdefault("properties", {})
    if REPEAT in props:
        raise UpstreamInvalid(
            f"the upstream tool {name} has an argument named {REPEAT!r}, the argument the "
            "proxy adds for deliberate repeats"
        )
    props[REPEAT] = {"type": "integer", "minimum": 1, "maximum": 1000, "description": REPEAT_HELP}
    return out


def _effect_tool(tool: types.Tool, schema: dict[str, Any], spec: UpstreamTool) -> types.Tool:
    act = (
        f"the {spec.target} and the arguments {', '.join(spec.intent_fields)}"
        if spec.intent_fields
        else f"the {spec.target or 'tool'} alone"
    )
    note = (
        f" (Through opledger: done at most once per act in your run — an act is {act}; "
        "asked again it answers how the first call's act stands. Name your run as the "
        "server's instructions say.)"
    )
    return types.Tool(
        name=tool.name,
        title=tool.title,
        description=(tool.description or "") + note,
        input_schema=schema,
        annotations=EFFECT_ANNOTATIONS,
        meta={ACTION_META: spec.action},
    )
