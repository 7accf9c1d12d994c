"""Where a state-changing request comes from: every request but GET, HEAD and OPTIONS
(signing in and out, resolving) must come from one of the console's own pages, checked
before anything else runs.

A browser says where a request comes from in `Origin` (every current browser sends it on a
POST) or, failing that, in `Sec-Fetch-Site`. A page of another site, or of another port of
the same host (cookies ignore ports, so `SameSite` cookies do not tell them apart), is
refused; so is a client that says neither.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger("opledger.console")

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def own_origin(request: Request) -> str:
    """The origin this request was addressed to: its scheme and Host, as the browser
    writes an origin (no default port)."""
    return str(request.base_url).rstrip("/").lower()


def same_origin(request: Request, expected: str) -> bool:
    """Whether the browser says this request comes from a page of `expected`."""
    origins = request.headers.getlist("origin")
    if len(origins) > 1:
        return False
    if origins:
        return origins[0].strip().lower() == expected
    sites = request.headers.getlist("sec-fetch-site")
    return sites == ["same-origin"]


class OriginCheck:
    """ASGI middleware: a state-changing request not from the console's own origin (the
    configured public origin, else the request's own) is answered by `refuse` (a 403)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        public_origin: str | None,
        refuse: Callable[[Request, str], Response],
    ) -> None:
        self.app, self.public_origin, self.refuse = app, public_origin, refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            request = Request(scope)
            expected = self.public_origin or own_origin(request)
            if not same_origin(request, expected):
                came_from = request.headers.get("origin") or request.headers.get(
                    "sec-fetch-site", "nowhere said"
                )
                log.warning(
                    "console: refused %s %s from %r (expected %s), client %s",
                    scope["method"],
                    scope["path"],
                    came_from[:200],
                    expected,
                    request.client.host if request.client else "?",
                )
                await self.refuse(request, expected)(scope, receive, send)
                return
        await self.app(scope, receive, send)
