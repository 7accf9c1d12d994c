"""The MCP server behind `opledger mcp serve` (the `[mcp]` extra: the official MCP SDK).

Each `tools/call` of an action's tool becomes an `Intent` asked through `Effects.aask`: the
tenant and the grant are the caller's (`clients`), the run is the call's
`_meta["opledger/run"]` under the caller's name, the intent is the act — so a call re-issued
under a new request id, after a lost answer or from a restarted agent, is answered with the
operation it recorded (an act of the tenant's scope, whichever caller's run recorded it:
the status tool follows it for any caller of the tenant). The answer is structured
content: the kind (confirmed, rejected, cancelled, unknown, pending) and what goes with
it. A call that cannot be an effect (arguments that do not match the tool's schema, no
run, a revoked grant) is a tool error and writes nothing; an unknown tool is a protocol
error.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import mcp_types as types
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST
from starlette.applications import Starlette

from opledger import __version__
from opledger.adapters.registry import Registry
from opledger.agents import answers
from opledger.agents.answers import REFUSED, REPEAT, UNFIXABLE, purpose_of, refused, summary
from opledger.agents.effects import EffectResult, Effects, at_rest
from opledger.ledger import InvalidInput, Operation, OperationNotFound
from opledger.ledger.ids import check_operation_id
from opledger.ledger.intents import TENANT, Intent
from opledger.observability import metrics

from .clients import Caller, Clients
from .tools import (
    RUN_META,
    STATUS_DESCRIPTION,
    STATUS_SCHEMA,
    STATUS_TOOL,
    description,
    input_schema,
)

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Each tool causes one external effect at most once per act in your run (or, where its "
    "description says so, whoever asks): set "
    f"_meta['{RUN_META}'] to your run's id (the same on every retry and restart). Asking "
    "again for an act answers how it stands; an unknown answer means it may have happened: "
    f"never do it another way. Ask {STATUS_TOOL} about a pending one."
)

Identify = Callable[[], Caller]


class Gateway:
    """The tools of `registry`'s actions (and the status tool), each call an effect."""

    def __init__(
        self,
        effects: Effects,
        registry: Registry,
        identify: Identify,
        *,
        wait: float,
        actions: Sequence[str] | None = None,
    ) -> None:
        """`actions`: the actions offered as tools (default: every one `registry` serves)."""
        self.effects = effects
        self.registry = registry
        self.identify = identify
        self.wait = wait
        offered = registry.actions if actions is None else tuple(actions)
        self._schemas = {a: input_schema(registry, a) for a in offered}
        self._validators = {a: Draft202012Validator(s) for a, s in self._schemas.items()}
        self._status_validator = Draft202012Validator(STATUS_SCHEMA)
        annotations = types.ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=True
        )
        self.tools = [
            types.Tool(
                name=a,
                description=description(registry, a),
                input_schema=self._schemas[a],
                annotations=annotations,
            )
            for a in offered
        ] + [
            types.Tool(
                name=STATUS_TOOL,
                description=STATUS_DESCRIPTION,
                input_schema=STATUS_SCHEMA,
                annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
            )
        ]

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        return STATUS_SCHEMA if name == STATUS_TOOL else self._schemas.get(name)

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self.identify()
        return types.ListToolsResult(tools=self.tools)

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        caller = self.identify()
        name, args = params.name, params.arguments or {}
        if name == STATUS_TOOL:
            return await self._status(caller, args)
        validator = self._validators.get(name)
        if validator is None:
            raise MCPError(INVALID_PARAMS, f"no tool {name!r}: tools/list names them")
        wrong = problems(validator, args)
        if wrong:
            return refusal(name, "InvalidArguments", f"the arguments do not fit: {wrong}")
        return await self.effect(
            ctx, params, caller, name, args["target"], args["payload"], args.get(REPEAT)
        )

    async def effect(
        self,
        ctx: ServerRequestContext[Any],
        params: types.CallToolRequestParams,
        caller: Caller,
        action: str,
        target: str,
        payload: dict[str, Any],
        repeat: int | None,
    ) -> types.CallToolResult:
        """A call as an effect of the caller's run (the call's arguments already checked)."""
        name = params.name
        run = (params.meta or {}).get(RUN_META)
        if not isinstance(run, str) or not run.strip():
            return refusal(
                name,
                "MissingRun",
                f"the call names no run: set _meta['{RUN_META}'] to your run's id, the same "
                "on every retry and restart",
            )
        try:
            intent = Intent(
                tenant=caller.tenant,
                workflow_id=caller.workflow_id(run),
                action=action,
                target=target,
                payload=payload,
                authorization_ref=caller.grant,
                purpose=purpose_of(repeat),
                asked_by=f"mcp:{caller.agent}:{ctx.request_id}",
            )
            result = await self.effects.aask(intent, wait=self.wait)
        except UNFIXABLE as exc:  # the gateway's configuration, not the call
            log.error("%s cannot be served: %s", name, exc)
            raise MCPError(INTERNAL_ERROR, f"{name} cannot be served: {exc}") from None
        except REFUSED as exc:
            return refused_answer(name, exc)
        return answer(name, result)

    async def _status(self, caller: Caller, args: dict[str, Any]) -> types.CallToolResult:
        wrong = problems(self._status_validator, args)
        if wrong:
            return refusal(STATUS_TOOL, "InvalidArguments", f"the arguments do not fit: {wrong}")
        op_id = args["op_id"]
        try:
            check_operation_id(op_id)
            result = await asyncio.to_thread(self.effects.result, op_id)
        except (InvalidInput, OperationNotFound) as exc:
            return refused_answer(STATUS_TOOL, exc)
        op = result.operation
        if not _readable(op, caller):
            # another caller's operation reads as no operation: no oracle for its ids
            return refused_answer(STATUS_TOOL, OperationNotFound(f"no operation {op_id}"))
        wait = float(args.get("wait", 0))
        if wait > 0 and not at_rest(result):
            result = await self.effects.await_result(op_id, wait)
        return answer(STATUS_TOOL, result)


def _readable(op: Operation, caller: Caller) -> bool:
    """Whether `caller` may read `op`: one of its own runs' operations, or a tenant-wide act
    of its tenant (one act whoever asks: a call of any of the tenant's callers is answered
    with it, so its status is theirs to follow)."""
    if op.tenant != caller.tenant:
        return False
    return op.intent_scope == TENANT or op.workflow_id.startswith(caller.workflow_id(""))


def problems(validator: Draft202012Validator, args: dict[str, Any]) -> str:
    errors: list[ValidationError] = sorted(
        validator.iter_errors(args), key=lambda e: [str(p) for p in e.absolute_path]
    )
    return "; ".join(
        f"{'.'.join(str(p) for p in e.absolute_path) or 'arguments'}: {e.message[:300]}"
        for e in errors[:5]
    )


def _content(data: dict[str, Any], *, error: bool) -> types.CallToolResult:
    text = json.dumps(data, sort_keys=True, default=str)
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        structured_content=json.loads(text),
        is_error=error,
    )


def answer(tool: str, result: EffectResult) -> types.CallToolResult:
    metrics.MCP_CALLS.labels(tool, result.kind).inc()
    return _content(summary(result), error=False)


def refused_answer(tool: str, exc: Exception) -> types.CallToolResult:
    metrics.MCP_CALLS.labels(tool, "refused").inc()
    return _content(refused(exc), error=True)


def refusal(tool: str, error: str, message: str) -> types.CallToolResult:
    metrics.MCP_CALLS.labels(tool, "refused").inc()
    return _content(answers.refusal(error, message), error=True)


def build_server(gateway: Gateway) -> Server[Any]:
    return Server(
        "opledger",
        version=__version__,
        instructions=INSTRUCTIONS,
        get_tool_input_schema=gateway.input_schema,
        on_list_tools=gateway.list_tools,
        on_call_tool=gateway.call_tool,
    )


class ClientVerifier:
    """The MCP SDK's `TokenVerifier` over the clients file: a token names its caller."""

    def __init__(self, clients: Clients) -> None:
        self.clients = clients

    async def verify_token(self, token: str) -> AccessToken | None:
        caller = self.clients.caller_for(token)
        if caller is None:
            return None
        return AccessToken(
            token=token,
            client_id=caller.agent,
            scopes=[],
            claims={"tenant": caller.tenant, "grant": caller.grant},
        )


def identify_by_token() -> Caller:
    """The caller of this HTTP request, as its bearer token (checked by the SDK's bearer
    middleware on every request) names it."""
    token = get_access_token()
    claims = (token.claims or {}) if token is not None else {}
    if token is None or "tenant" not in claims:
        raise MCPError(INVALID_REQUEST, "no credentials: send Authorization: Bearer <token>")
    return Caller(agent=token.client_id, tenant=claims["tenant"], grant=claims["grant"])


def identify_as(clients: Clients, token: str) -> Identify:
    """For stdio: every call is the one caller `token` names, checked again on each call
    (a token removed from the clients file stops working at once)."""

    def identify() -> Caller:
        caller = clients.caller_for(token)
        if caller is None:
            raise MCPError(INVALID_REQUEST, "OPLEDGER_MCP_TOKEN is not a client's token")
        return caller

    return identify


def http_app(
    gateway: Gateway, clients: Clients, *, host: str, path: str, public_url: str
) -> Starlette:
    """Streamable HTTP at `path`, every request authenticated by its bearer token."""
    server = build_server(gateway)
    return server.streamable_http_app(
        streamable_http_path=path,
        stateless_http=True,  # any replica answers any call: no session to lose
        host=host,
        auth=AuthSettings(
            issuer_url=public_url, resource_server_url=None, validate_token_resource=False
        ),
        token_verifier=ClientVerifier(clients),
    )


async def serve_stdio(gateway: Gateway) -> None:
    server = build_server(gateway)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
