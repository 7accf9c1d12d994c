"""The review console as an ASGI app (Starlette, server-rendered Jinja2, no JavaScript).

Its rooms: `sessions` (who a request acts for: the session cookie or the trusted SSO
header, CSRF tokens), `signin` (signing in and out, throttled by `throttle`), `web`
(templates, and the wrappers that make a handler a page), `routes` (the review pages),
`approvals` (the approval queue and its decisions), `base` (configuration, refusals), and
two middlewares: `headers` (the security headers of every answer) and `origins` (a
state-changing request from anywhere but the console's own pages is refused before
anything runs). Every page acts for one authenticated operator and one
tenant named in its URL (`/t/{tenant}/...`); a tenant the operator does not act for, and
another tenant's operation, are the same "not found". Every decision goes through
`ledger.reviews` — the same code, checks and audit trail as `opledger review` — or, for an
approval, `Ledger.approve`/`deny` as `opledger approvals` does, with the operator taken
from the session, never from the form. Every form carries the session's
CSRF token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib.resources import files

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from opledger.ledger.facades import ConsoleLedger
from opledger.ledger.ids import parse_age

from .accounts import Accounts
from .approvals import ApprovalPages
from .base import ConsoleConfig, Refusal
from .headers import SecurityHeaders
from .origins import OriginCheck
from .routes import Routes
from .sessions import Sessions
from .signin import SignIn
from .web import Pages


def create_app(
    ledger: ConsoleLedger,
    accounts: Accounts,
    config: ConsoleConfig | None = None,
    *,
    publish_retry: Callable[[str], str | None] | None = None,
) -> Starlette:
    """The console for `ledger`. `publish_retry(op_id)` hands an authorized retry to a
    worker now (None when published, else why not); without it, the sweep sends it."""
    cfg = config or ConsoleConfig()
    sessions = Sessions(accounts, cfg)
    pages = Pages(cfg, sessions)
    signin = SignIn(pages, sessions)
    r = Routes(pages, ledger.reviews, cfg, publish_retry, ledger.providers)
    a = ApprovalPages(pages, ledger, ledger.reviews, cfg)
    pages.count_waiting = a.waiting_for

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    static = StaticFiles(directory=str(files("opledger.console") / "static"))
    routes = [
        Route("/healthz", health),
        Route("/login", signin.login, methods=["GET", "POST"]),
        Route("/logout", pages.form_page(signin.logout), methods=["POST"]),
        Route("/", pages.page(r.queue)),
        Route("/search", pages.page(r.search)),
        Route("/t/{tenant}/ops/{op_id}", pages.page(r.operation)),
        Route("/t/{tenant}/ops/{op_id}/review", pages.page(r.review)),
        Route("/t/{tenant}/ops/{op_id}/resolve", pages.form_page(r.resolve), methods=["POST"]),
        Route("/t/{tenant}/ops/{op_id}/audit", pages.page(r.audit)),
        Route("/approvals", pages.page(a.queue)),
        Route("/t/{tenant}/ops/{op_id}/approval", pages.page(a.approval)),
        Route("/t/{tenant}/ops/{op_id}/approve", pages.form_page(a.approve), methods=["POST"]),
        Route("/t/{tenant}/ops/{op_id}/deny", pages.form_page(a.deny), methods=["POST"]),
        Mount("/static", app=static, name="static"),
    ]

    def refuse_origin(request: Request, expected: str) -> Response:
        return pages.refused(
            request,
            Refusal(
                403,
                "refused",
                f"this request did not come from a page of this console ({expected}): "
                "nothing was changed. Open the console itself and submit the form from there.",
            ),
        )

    check_origin = Middleware(OriginCheck, public_origin=cfg.public_origin, refuse=refuse_origin)
    return Console(routes=routes, middleware=[check_origin])


class Console(Starlette):
    """Starlette with `SecurityHeaders` outside everything, its error pages included."""

    def build_middleware_stack(self) -> ASGIApp:
        return SecurityHeaders(super().build_middleware_stack())


__all__: Sequence[str] = ("ConsoleConfig", "create_app", "parse_age")
