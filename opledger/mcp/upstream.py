"""An MCP server behind `opledger mcp proxy`: which of its tools have effects, and how.

The upstream file (`OPLEDGER_MCP_UPSTREAM`, JSON) names the server and sorts its tools:
`effects` are routed through the ledger (each becomes an action, served to the workers by
`McpToolAdapter`), `passthrough` tools are read-only and forwarded as they are. A tool in
neither list is not offered at all: an effect nobody declared never bypasses the ledger.

    {"url": "http://127.0.0.1:9000/mcp", "provider": "tickets",
     "bearer_env": "TICKETS_TOKEN",
     "effects": {"create_ticket": {"action": "tickets.create_ticket.v1",
                                   "target": "project", "intent_fields": ["title"],
                                   "effect": "ticket"}},
     "passthrough": ["search_tickets"]}

An MCP tool deduplicates nothing and offers no lookup (unless its adapter says otherwise):
an answer that never came is unknown and goes to a person, never retried blindly.

`build_registry` is an `OPLEDGER_ADAPTERS` factory: the bundled adapters and the upstream's
tools, for the workers and the proxy alike.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from opledger.ledger import InvalidInput
from opledger.ledger.ids import check_action
from opledger.ledger.intents import check_fields
from opledger.settings import Settings


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


def build_registry(settings: Settings) -> Any:
    """The bundled adapters and, when `OPLEDGER_MCP_UPSTREAM` names a file, its effectful
    tools (an `OPLEDGER_ADAPTERS` factory: `opledger.mcp.upstream:build_registry`)."""
    from opledger.adapters.defaults import build_registry as defaults

    registry = defaults(settings)
    if settings.mcp_upstream:
        from .adapter import McpToolAdapter

        registry.register(McpToolAdapter(load_upstream(settings.mcp_upstream)))
    return registry
