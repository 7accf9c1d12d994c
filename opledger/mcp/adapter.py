"""The adapter that sends an action to a tool of an upstream MCP server (the workers' side
of `opledger mcp proxy`; the `[mcp]` extra).

An MCP tool deduplicates nothing and has no lookup, so the contract says so: a call whose
answer never came is ambiguous, and with neither a key nor a lookup the decision sends it
to a person instead of calling again. What provably sent nothing is recorded as not sent:
a failure while connecting and initializing, before the `tools/call` request left. A tool
error (`isError`) is ambiguous too (a tool may fail after part of its effect); a JSON-RPC
refusal of the request itself (no such tool, invalid arguments) is a rejection.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND

from opledger.adapters.base import (
    INCONCLUSIVE,
    NOT_SENT,
    Contract,
    Idempotency,
    Lookup,
    LookupResult,
)
from opledger.ledger import (
    Ambiguous,
    Attempt,
    Binding,
    Claim,
    Confirmed,
    Operation,
    Outcome,
    Rejected,
)
from opledger.ledger.evidence import RESULT_LIMIT

from .upstream import Upstream

#: the outcome code of a `tools/call` whose answer never came
NO_ANSWER = "upstream_no_answer"
#: the outcome code of a tool's own error (`isError`)
TOOL_ERROR = "upstream_tool_error"


@asynccontextmanager
async def connect(upstream: Upstream) -> AsyncIterator[Client]:
    """An MCP session with the upstream (connected and initialized), with its bearer token."""
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
                return Ambiguous(code=NOT_SENT, reason=reason, detail={"why": "not_connected"})
            return Ambiguous(code=NO_ANSWER, reason=reason)

    async def _call(self, claim: Claim, sent: list[bool]) -> Outcome:
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
