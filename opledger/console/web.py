"""The console's pages: the templates and their filters, and the wrappers that make a
handler a page (authenticated, in the threadpool, refusals rendered). The security
headers are `headers.SecurityHeaders`'s, on every answer."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from opledger.ledger.errors import InvalidInput, OperationNotFound, ReviewNotFound
from opledger.ledger.sensitive import scrub_text

from .base import ConsoleConfig, Refusal
from .sessions import Auth, Sessions


def ago(value: datetime, now: datetime) -> str:
    seconds = max(0, int((now - value).total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


def _when(value: Any) -> str:
    return "" if value is None else str(value)[:19].replace("T", " ")


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _binds(binding: Any) -> list[str]:
    names = {
        "idempotency_key": "key",
        "receipt_id": "receipt",
        "target": "target",
        "payload_digest": "payload digest",
        "resulting_version": "resulting version",
    }
    return [f"{label} {getattr(binding, k)}" for k, label in names.items() if getattr(binding, k)]


def environment() -> Environment:
    """The console's templates, autoescaped, with its filters."""
    env = Environment(
        loader=PackageLoader("opledger.console", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["pretty"] = _json
    env.filters["binds"] = _binds
    # free text that may quote a provider's error (a review's reason, a transition's, a
    # refusal's list of changes): what looks like a secret in it is hidden
    env.filters["unsecret"] = scrub_text
    env.globals["quote"] = lambda s: quote(str(s), safe="")
    return env


Handler = Callable[[Request, Auth], Response]
FormHandler = Callable[[Request, Auth, Any], Response]
Endpoint = Callable[[Request], Awaitable[Response]]


class Pages:
    """Renders the console's pages and makes handlers of them: `page` for an authenticated
    GET, `form_page` for a POST whose CSRF token is checked before anything runs."""

    def __init__(self, config: ConsoleConfig, sessions: Sessions) -> None:
        self.config = config
        self.sessions = sessions
        self.env = environment()
        #: counts the approvals waiting for an operator, for the nav of every page
        self.count_waiting: Callable[[Auth], int] | None = None

    def render(
        self, request: Request, name: str, status: int = 200, auth: Auth | None = None, **ctx: Any
    ) -> HTMLResponse:
        ctx.setdefault("operator", auth.operator if auth else None)
        ctx.setdefault("csrf", auth.session.csrf_token if auth else "")
        ctx.setdefault("trusted_header", self.config.trusted_header)
        ctx.setdefault("approvals_waiting", auth.approvals_waiting if auth else None)
        html = self.env.get_template(name).render(request=request, **ctx)
        response = HTMLResponse(html, status_code=status)
        if auth is not None and auth.new_token:
            self.sessions.set_session_cookie(request, response, auth.new_token)
        return response

    def page(self, handler: Handler) -> Endpoint:
        """An authenticated GET page: runs in the threadpool; refusals become pages."""

        async def endpoint(request: Request) -> Response:
            def run() -> Response:
                auth = self.sessions.authenticate(request)
                if auth is None:
                    return RedirectResponse(
                        "/login?" + urlencode({"next": request.url.path}), status_code=303
                    )
                if self.count_waiting is not None:
                    auth.approvals_waiting = self.count_waiting(auth)
                return handler(request, auth)

            return await self.guarded(request, run)

        return endpoint

    def form_page(self, handler: FormHandler) -> Endpoint:
        """An authenticated POST: the CSRF token is checked before anything else runs."""

        async def endpoint(request: Request) -> Response:
            form = await request.form()

            def run() -> Response:
                auth = self.sessions.authenticate(request)
                if auth is None:
                    raise Refusal(401, "not signed in", "your session ended: sign in again")
                self.sessions.check_csrf(auth, form)
                return handler(request, auth, form)

            return await self.guarded(request, run)

        return endpoint

    def refused(self, request: Request, refusal: Refusal) -> Response:
        """A refusal as a page, with its headers."""
        response = self.render(
            request,
            "refused.html",
            refusal.status,
            title=refusal.title,
            message=refusal.message,
            **refusal.extra,
        )
        response.headers.update(refusal.headers)
        return response

    async def guarded(self, request: Request, run: Callable[[], Response]) -> Response:
        """`run` in the threadpool; a refusal (or a missing or invalid thing) as a page."""
        try:
            return await run_in_threadpool(run)
        except Refusal as refusal:
            return self.refused(request, refusal)
        except (OperationNotFound, ReviewNotFound):
            return self.refused(request, Refusal(404, "not found", "not found"))
        except InvalidInput as exc:
            return self.refused(request, Refusal(400, "refused", str(exc)))
