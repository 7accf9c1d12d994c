"""The MCP server behind `opledger mcp serve` (the `[mcp]` extra: the official MCP SDK).

Each `tools/call` of an action's tool becomes an `Intent` asked through `Effects.aask`: the
tenant and the grant are the caller's (`clients`), the run is the call's
`_meta["opledger/run"]` under the caller's name (or, for a host that cannot set `_meta`,
what its client's run mode says: `workflow_of`), the intent is the act — so a call re-issued
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
import copy
import json
import logging
import unicodedata
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
from opledger.adapters.mcp import McpToolAdapter
from opledger.adapters.registry import Registry
from opledger.agents import answers
from opledger.agents.answers import REFUSED, REPEAT, UNFIXABLE, purpose_of, refused, summary
from opledger.agents.effects import EffectResult, Effects, at_rest
from opledger.ledger import InvalidInput, Operation, OperationNotFound
from opledger.ledger.ids import MAX_IDENTIFIER_LENGTH, check_operation_id
from opledger.ledger.intents import TENANT, Intent
from opledger.observability import metrics

from .clients import ARGUMENT, META, TOKEN, Caller, Clients
from .tools import (
    ACTION_META,
    LEGACY_STATUS_TOOL,
    RUN_ARGUMENT,
    RUN_META,
    STATUS_DESCRIPTION,
    STATUS_SCHEMA,
    STATUS_TOOL,
    description,
    input_schema,
    tool_names,
    with_run_argument,
)

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Each tool causes one external effect at most once per act in your run (or, where its "
    "description says so, whoever asks): set "
    f"_meta['{RUN_META}'] to your run's id (the same on every retry and restart), or, where "
    f"the tools have a '{RUN_ARGUMENT}' argument, set that. Asking again for an act answers "
    "how it stands; an unknown answer means it may have happened: never do it another way. "
    f"Ask {STATUS_TOOL} about a pending one, and about an unknown one until it names a "
    "review_id."
)
EFFECT_ANNOTATIONS = types.ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=True
)
STATUS = types.Tool(
    name=STATUS_TOOL,
    description=STATUS_DESCRIPTION,
    input_schema=STATUS_SCHEMA,
    annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
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
        """`actions`: the actions offered as tools (default: every one `registry` serves
        but an MCP upstream's, which are `opledger mcp proxy`'s: `gateway_actions`)."""
        self.effects = effects
        self.registry = registry
        self.identify = identify
        self.wait = wait
        offered = gateway_actions(registry) if actions is None else tuple(actions)
        #: tool name -> action (`ToolNameClash` here, at start, for two actions of one name)
        self._action_of = tool_names(offered)
        #: the names 0.1.0 offered (the actions themselves), still served: name -> tool
        self._aliases = {a: name for name, a in self._action_of.items()}
        self._aliases[LEGACY_STATUS_TOOL] = STATUS_TOOL
        self._schemas: dict[str, Mapping[str, Any]] = {}
        #: by run mode: the tools a caller is offered and what its calls are checked by
        self._tools: dict[bool, list[types.Tool]] = {False: [], True: []}
        self._checks: dict[bool, dict[str, Draft202012Validator]] = {False: {}, True: {}}
        #: an `argument` client's tools, by the longest run its name leaves room for
        self._argument_tools: dict[int, list[types.Tool]] = {}
        self._status_validator = Draft202012Validator(STATUS_SCHEMA)
        for name, a in self._action_of.items():
            tool = types.Tool(
                name=name,
                title=a,
                description=description(registry, a),
                input_schema=input_schema(registry, a),
                annotations=EFFECT_ANNOTATIONS,
                meta={ACTION_META: a},
            )
            # the payload is the ledger's to check (`prepare`, against the same schema):
            # an act already recorded, asked again in other words, is answered with it
            # rather than refused as if nothing had been done
            loose = dict(tool.input_schema)
            loose["properties"] = {**loose["properties"], "payload": {"type": "object"}}
            self.offer(tool, checked=loose)

    def offer(
        self, tool: types.Tool, *, effect: bool = True, checked: Mapping[str, Any] | None = None
    ) -> None:
        """Offer `tool`; an effect's calls are checked against its input schema (or
        `checked`), and a client of the `argument` run mode is offered it with a required
        `run` argument (not at all when the schema has a `run` of its own: which would be
        the run?)."""
        self._tools[False].append(tool)
        if not effect:
            self._tools[True].append(tool)
            return
        schema = tool.input_schema
        self._schemas[tool.name] = schema
        check = schema if checked is None else checked
        self._checks[False][tool.name] = Draft202012Validator(check)
        try:
            shown = with_run_argument(schema, required=True)
        except ValueError:
            log.warning("%s has an argument named %r: not offered", tool.name, RUN_ARGUMENT)
            return
        self._tools[True].append(tool.model_copy(update={"input_schema": shown}))
        # a _meta run needs no run argument
        self._checks[True][tool.name] = Draft202012Validator(
            with_run_argument(check, required=False)
        )

    @property
    def tools(self) -> list[types.Tool]:
        """The tools a client that names its run in `_meta` (or by its token) is offered."""
        return [*self._tools[False], STATUS]

    def tools_for(self, caller: Caller) -> list[types.Tool]:
        if caller.run_mode != ARGUMENT:
            return self.tools
        limit = caller.max_run_length
        if limit not in self._argument_tools:
            self._argument_tools[limit] = [self._run_fits(t, limit) for t in self._tools[True]]
        return [*self._argument_tools[limit], STATUS]

    def _run_fits(self, tool: types.Tool, limit: int) -> types.Tool:
        """An effect's tool as a caller whose runs leave `limit` characters sees it: its
        `run` argument declares that as its maxLength."""
        if tool.name not in self._schemas:  # passed through: no run argument of ours
            return tool
        schema = copy.deepcopy(tool.input_schema)
        schema["properties"][RUN_ARGUMENT]["maxLength"] = limit
        return tool.model_copy(update={"input_schema": schema})

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        return STATUS_SCHEMA if name == STATUS_TOOL else self._schemas.get(name)

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools_for(self.identify()))

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        caller = self.identify()
        if params.name in self._aliases:  # a name 0.1.0 offered: the tool it now is
            params = params.model_copy(update={"name": self._aliases[params.name]})
        name, args = params.name, dict(params.arguments or {})
        if name == STATUS_TOOL:
            return await self._status(caller, args)
        validator = self._checks[caller.run_mode == ARGUMENT].get(name)
        if validator is None:
            raise MCPError(INVALID_PARAMS, f"no tool {name!r}: tools/list names them")
        wrong = problems(validator, args)
        if wrong:
            return refusal(name, "InvalidArguments", f"the arguments do not fit: {wrong}")
        claimed = args.pop(RUN_ARGUMENT, None) if caller.run_mode == ARGUMENT else None
        act = self.act_of(name, args)
        if isinstance(act, types.CallToolResult):
            return act
        return await self.effect(ctx, params, caller, *act, claimed=claimed)

    def act_of(
        self, name: str, args: dict[str, Any]
    ) -> tuple[str, str, dict[str, Any], int | None] | types.CallToolResult:
        """The act a call's checked arguments ask for (action, target, payload, repeat), or
        the refusal of a call that names none."""
        return self._action_of[name], args["target"], args["payload"], args.get(REPEAT)

    async def effect(
        self,
        ctx: ServerRequestContext[Any],
        params: types.CallToolRequestParams,
        caller: Caller,
        action: str,
        target: str,
        payload: dict[str, Any],
        repeat: int | None,
        *,
        claimed: str | None = None,
    ) -> types.CallToolResult:
        """A call as an effect of the caller's run (the call's arguments already checked;
        `claimed`: its `run` argument, for a client of the `argument` run mode)."""
        name = params.name
        try:
            workflow_id = workflow_of(caller, params.meta, claimed)
        except RunRefused as exc:
            return refusal(name, exc.error, exc.why)
        try:
            intent = Intent(
                tenant=caller.tenant,
                workflow_id=workflow_id,
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
        return answer(name, result, purpose=intent.purpose)

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


def gateway_actions(registry: Registry) -> tuple[str, ...]:
    """The actions `opledger mcp serve` offers: every one `registry` serves but an MCP
    upstream's (`proxied_actions`)."""
    proxied = set(proxied_actions(registry))
    return tuple(a for a in registry.actions if a not in proxied)


def proxied_actions(registry: Registry) -> tuple[str, ...]:
    """The actions of an MCP upstream's tools (`McpToolAdapter`): `opledger mcp proxy`
    offers them under the tools' own names and input schemas, which only the upstream
    knows. `serve` does not offer them: as target and payload with no schema, a call would
    skip the schema the upstream enforces, and a second name for one act is a second way
    to ask it."""
    return tuple(a for a in registry.actions if isinstance(registry.adapter_for(a), McpToolAdapter))


class RunRefused(Exception):
    """Why a call names no run it may have: `error`, the refusal's kind, and `why`, in words
    the caller can act on."""

    def __init__(self, error: str, why: str) -> None:
        super().__init__(why)
        self.error = error
        self.why = why


def workflow_of(caller: Caller, meta: Mapping[str, Any] | None, claimed: str | None) -> str:
    """The ledger's run of a call, or `RunRefused` when the call names none it may have.

    The call's `_meta["opledger/run"]` wins whenever it is there (a host that can name its
    run always may); without it, the caller's run mode decides: a `token` client's own run,
    an `argument` client's `run` argument. Never anything a retry or a new connection
    changes (a request id, a session, the time of day)."""
    meta = meta or {}
    if RUN_META in meta:
        run = meta[RUN_META]
        if not isinstance(run, str) or not run.strip():
            raise RunRefused(
                "InvalidRun",
                f"_meta['{RUN_META}'] must be a non-blank string, your run's id (the same on "
                f"every retry and restart), not {_json_kind(run)}",
            )
        return caller.workflow_id(_fitting(caller, run, f"_meta['{RUN_META}']", "InvalidRun"))
    if caller.run_mode == TOKEN:
        return caller.own_run
    if caller.run_mode == ARGUMENT and claimed is not None and claimed.strip():
        where = f"the {RUN_ARGUMENT!r} argument"
        return caller.workflow_id(_fitting(caller, claimed, where, "InvalidArguments"))
    raise RunRefused("MissingRun", missing_run(caller))


def _fitting(caller: Caller, run: str, where: str, error: str) -> str:
    """`run`, if the ledger's run it makes (`mcp:<agent>:<run>`) is not too long."""
    length = len(unicodedata.normalize("NFC", run))
    if length > caller.max_run_length:
        raise RunRefused(
            error,
            f"{where} is {length} characters; at most {caller.max_run_length} fit (the run is "
            f"kept as {caller.workflow_id('<run>')}, at most {MAX_IDENTIFIER_LENGTH} "
            "characters): use a shorter id, the same on every retry and restart",
        )
    return run


def _json_kind(value: Any) -> str:
    if isinstance(value, str):
        return "a blank one"
    kinds = {bool: "a boolean", int: "a number", float: "a number", dict: "an object"}
    return kinds.get(type(value), "an array" if isinstance(value, list) else "null")


def missing_run(caller: Caller) -> str:
    if caller.run_mode == ARGUMENT:
        return (
            f"the call names no run: set the {RUN_ARGUMENT!r} argument to your run's id, the "
            "same on every retry and restart"
        )
    return (
        f"the call names no run: set _meta['{RUN_META}'] to your run's id, the same on every "
        "retry and restart"
    )


def _readable(op: Operation, caller: Caller) -> bool:
    """Whether `caller` may read `op`: one of its own runs' operations, or a tenant-wide act
    of its tenant (one act whoever asks: a call of any of the tenant's callers is answered
    with it, so its status is theirs to follow)."""
    if op.tenant != caller.tenant:
        return False
    return op.intent_scope == TENANT or caller.owns(op.workflow_id)


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


def answer(tool: str, result: EffectResult, *, purpose: str | None = None) -> types.CallToolResult:
    """`result` as the call's answer; `purpose`: the asked intent's (a deliberate repeat's),
    so the next repeat the answer names is the next number."""
    metrics.MCP_CALLS.labels(tool, result.kind).inc()
    return _content(summary(result, purpose=purpose), error=False)


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
            claims={"tenant": caller.tenant, "grant": caller.grant, "run": caller.run_mode},
        )


def identify_by_token() -> Caller:
    """The caller of this HTTP request, as its bearer token (checked by the SDK's bearer
    middleware on every request) names it."""
    token = get_access_token()
    claims = (token.claims or {}) if token is not None else {}
    if token is None or "tenant" not in claims:
        raise MCPError(INVALID_REQUEST, "no credentials: send Authorization: Bearer <token>")
    return Caller(
        agent=token.client_id,
        tenant=claims["tenant"],
        grant=claims["grant"],
        run_mode=claims.get("run", META),
    )


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
    """Streamable HTTP at `path`, every request authenticated by its bearer token.

    Each request is answered with one JSON body, never an SSE stream: a client sees a
    gateway that dies mid-call as a failed request at once (a broken SSE stream is one a
    client may wait to resume until its own timeout), and the gateway sends nothing else
    on a call's stream (no server-initiated requests, no progress) that JSON would drop."""
    server = build_server(gateway)
    return server.streamable_http_app(
        streamable_http_path=path,
        json_response=True,
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
