"""The adapter of an upstream MCP server's effectful tools (the workers' side of `opledger
mcp proxy`), and the upstream file that describes them.

The upstream file (`OPLEDGER_MCP_UPSTREAM`, JSON) names the server and sorts its tools:
`effects` are routed through the ledger (each becomes an action, served to the workers by
`McpToolAdapter`), `passthrough` tools are read-only and forwarded as they are by the
proxy. A tool in neither list is not offered at all: an effect nobody declared never
bypasses the ledger.

    {"url": "http://127.0.0.1:9000/mcp", "provider": "tickets",
     "bearer_env": "TICKETS_TOKEN",
     "effects": {"create_ticket": {"action": "tickets.create_ticket.v1",
                                   "target": "project", "intent_fields": ["title"],
                                   "effect": "ticket"}},
     "passthrough": ["search_tickets"]}

An MCP tool deduplicates nothing and has no lookup, so the contract says so: a call whose
answer never came is ambiguous, and with neither a key nor a lookup the decision sends it
to a person instead of calling again. What provably sent nothing is recorded as not sent:
a failure while connecting and initializing, before the `tools/call` request left. A tool
error (`isError`) is ambiguous too (a tool may fail after part of its effect); a JSON-RPC
refusal of the request itself (no such tool, invalid arguments) is a rejection.

`build_registry` is an `OPLEDGER_ADAPTERS` factory: the bundled adapters and the upstream's
tools, for the workers and the proxy alike. The MCP SDK (the `[mcp]` extra) is imported
only to connect and call, so the upstream file reads without it; an adapter is refused at
construction without it.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from opledger.ledger import (
    Ambiguous,
    Attempt,
    Binding,
    Claim,
    Confirmed,
    InvalidInput,
    Operation,
    Outcome,
    Rejected,
)
from opledger.ledger.evidence import RESULT_LIMIT
from opledger.ledger.ids import check_action
from opledger.ledger.intents import check_fields
from opledger.settings import Settings

from .base import (
    INCONCLUSIVE,
    Contract,
    Idempotency,
    Lookup,
    LookupResult,
    unreached,
)

if TYPE_CHECKING:
    from mcp import Client

    from .registry import Registry

# -- the upstream file ------------------------------------------------------------------


class UpstreamTool(BaseModel):
    """How one effectful upstream tool becomes an action."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the versioned action its calls are recorded as (`tickets.create_ticket.v1`)
    action: str
    #: the argument naming what the act is done to; none: the tool itself is the target
    target: str | None = None
    #: the arguments whose values make another act (see `opledger.ledger.intents`)
    intent_fields: tuple[str, ...] = ()
    #: what one effect is called in a review ("ticket")
    effect: str = "effect"

    @field_validator("action")
    @classmethod
    def _action(cls, value: str) -> str:
        return check_action(value)

    @field_validator("intent_fields")
    @classmethod
    def _fields(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_fields(value)


class Upstream(BaseModel):
    """The upstream MCP server and its tools."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    #: the contract's provider name (claim terms, metrics, reviews)
    provider: str = "upstream"
    #: the environment variable holding the bearer token the upstream expects, if any
    bearer_env: str | None = None
    timeout_seconds: float = Field(default=30.0, gt=0)
    effects: dict[str, UpstreamTool] = Field(default_factory=dict)
    passthrough: tuple[str, ...] = ()

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be the upstream's streamable HTTP URL (http:// or https://)")
        return value

    def headers(self) -> dict[str, str]:
        if not self.bearer_env:
            return {}
        token = os.environ.get(self.bearer_env)
        if not token:
            raise UpstreamInvalid(f"{self.bearer_env} (the upstream's bearer token) is not set")
        return {"Authorization": f"Bearer {token}"}

    def tool_of(self, action: str) -> str:
        """The upstream tool an action calls."""
        return next(name for name, t in self.effects.items() if t.action == action)


class UpstreamInvalid(InvalidInput):
    """The upstream file cannot be read or is not what the proxy needs."""


def load_upstream(path: str | os.PathLike[str]) -> Upstream:
    source = Path(path)
    try:
        text = source.read_text()
    except OSError as exc:
        raise UpstreamInvalid(f"cannot read the upstream file {source}: {exc}") from None
    try:
        upstream = Upstream.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UpstreamInvalid(f"the upstream file {source}: {where}: {first['msg']}") from None
    both = set(upstream.effects) & set(upstream.passthrough)
    if both:
        raise UpstreamInvalid(
            f"the upstream file {source}: {', '.join(sorted(both))} cannot be both an effect "
            "and passed through"
        )
    actions = [t.action for t in upstream.effects.values()]
    if len(set(actions)) != len(actions):
        raise UpstreamInvalid(f"the upstream file {source}: two tools share one action")
    return upstream


# -- the adapter ------------------------------------------------------------------------

#: the outcome code of a `tools/call` whose answer never came
NO_ANSWER = "upstream_no_answer"
#: the outcome code of a tool's own error (`isError`)
TOOL_ERROR = "upstream_tool_error"


@asynccontextmanager
async def connect(upstream: Upstream) -> AsyncIterator[Client]:
    """An MCP session with the upstream (connected and initialized), with its bearer token."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    timeout = upstream.timeout_seconds
    async with (
        httpx2.AsyncClient(headers=upstream.headers(), timeout=timeout) as http,
        Client(streamable_http_client(upstream.url, http_client=http)) as client,
    ):
        yield client


def upstream_contract(upstream: Upstream) -> Contract:
    timeout = timedelta(seconds=upstream.timeout_seconds)
    effects = {t.effect for t in upstream.effects.values()}
    return Contract(
        provider=upstream.provider,
        effect=effects.pop() if len(effects) == 1 else "effect",
        idempotency=Idempotency(kind="none"),
        lookup=Lookup(kind="none"),
        request_timeout=timeout,
        max_in_flight=timeout * 2,
        source="an MCP server's tools: MCP deduplicates nothing and offers no lookup",
    )


class McpToolAdapter:
    """The upstream's effectful tools, one action each."""

    def __init__(self, upstream: Upstream, *, contract: Contract | None = None) -> None:
        import mcp  # noqa: F401 - the [mcp] extra: a worker without it refuses at start

        self.upstream = upstream
        self.url = upstream.url  # where its requests go (contract check's endpoint rule)
        self.contract = contract or upstream_contract(upstream)
        self.actions: tuple[str, ...] = tuple(t.action for t in upstream.effects.values())
        self.intent_fields = {t.action: t.intent_fields for t in upstream.effects.values()}

    def dispatch(self, claim: Claim) -> Outcome:
        sent = [False]
        try:
            return anyio.run(self._call, claim, sent)
        except BaseException as exc:  # the SDK groups a transport's errors
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            reason = f"{type(exc).__name__}: {exc}"[:500]
            if not sent[0]:  # connecting or initializing failed: no tools/call left us
                return unreached(f"the upstream was not reached, nothing sent: {reason}")
            return Ambiguous(code=NO_ANSWER, reason=reason)

    async def _call(self, claim: Claim, sent: list[bool]) -> Outcome:
        from mcp.shared.exceptions import MCPError
        from mcp_types.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND

        name = self.upstream.tool_of(claim.operation.action)
        async with connect(self.upstream) as client:
            claim.window.check()  # the last moment before the effect's request leaves
            sent[0] = True
            try:
                result = await client.call_tool(name, claim.payload)
            except MCPError as exc:
                if exc.code in (INVALID_PARAMS, METHOD_NOT_FOUND):
                    return Rejected(code=f"mcp_{exc.code}", reason=exc.message[:500])
                return Ambiguous(
                    code=NO_ANSWER, reason=f"MCP error {exc.code}: {exc.message}"[:500]
                )
        data: dict[str, Any] = (
            result.structured_content
            if isinstance(result.structured_content, dict)
            else _text_result(" ".join(getattr(c, "text", "") for c in result.content))
        )
        if result.is_error:
            return Ambiguous(code=TOOL_ERROR, reason="the tool reported an error", detail=data)
        return Confirmed(
            receipt_id=f"{claim.idempotency_key}@{self.contract.provider}",
            binding=Binding(idempotency_key=claim.idempotency_key, target=claim.operation.target),
            result=data,
        )

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        return LookupResult(verdict=INCONCLUSIVE, detail={"reason": "MCP tools offer no lookup"})


def _text_result(text: str) -> dict[str, Any]:
    """A tool's text answer as result data, cut to fit what the ledger keeps of a result
    (`RESULT_LIMIT` bytes of canonical JSON), rather than dropped whole for its size."""
    doc: dict[str, Any] = {"text": text}
    while len(json.dumps(doc, ensure_ascii=False).encode()) > RESULT_LIMIT - 64:
        text = text[: len(text) * 3 // 4]
        doc = {"text": text, "truncated": True}
    return doc


# -- the registry -----------------------------------------------------------------------


def build_registry(settings: Settings) -> Registry:
    """The bundled adapters and, when `OPLEDGER_MCP_UPSTREAM` names a file, its effectful
    tools (an `OPLEDGER_ADAPTERS` factory: `opledger.adapters.mcp:build_registry`)."""
    from .defaults import build_registry as defaults

    registry = defaults(settings)
    if settings.mcp_upstream:
        registry.register(McpToolAdapter(load_upstream(settings.mcp_upstream)))
    return registry
