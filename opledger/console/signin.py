"""Signing in and out of the review console (password mode; in trusted-header mode the SSO
proxy signs operators in). The sign-in form carries a nonce of its own, from a cookie."""

from __future__ import annotations

import hmac
import logging
import secrets
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from .base import secured
from .sessions import LOGIN_COOKIE, SESSION_COOKIE, Auth, Sessions
from .web import Pages

log = logging.getLogger("opledger.console")


class SignIn:
    """`/login` (GET: the form; POST: check the password, start a session) and `/logout`."""

    def __init__(self, pages: Pages, sessions: Sessions) -> None:
        self.pages, self.sessions = pages, sessions

    def _login_page(self, request: Request, status: int = 200, **ctx: Any) -> Response:
        nonce = secrets.token_urlsafe(24)
        response: Response = self.pages.render(request, "login.html", status, nonce=nonce, **ctx)
        response.set_cookie(
            LOGIN_COOKIE,
            nonce,
            httponly=True,
            samesite="strict",
            secure=self.sessions.secure(request),
        )
        return response

    async def login(self, request: Request) -> Response:
        cfg, accounts = self.sessions.config, self.sessions.accounts
        next_url = request.query_params.get("next", "/")
        if request.method == "GET":
            if cfg.trusted_header:
                return RedirectResponse("/", status_code=303)
            return secured(self._login_page(request, next=safe_next(next_url)))
        form = await request.form()
        if cfg.trusted_header:
            return PlainTextResponse("sign in through the SSO proxy", status_code=403)
        sent, expected = form.get("csrf_token"), request.cookies.get(LOGIN_COOKIE, "")
        if not (
            isinstance(sent, str)
            and expected
            and hmac.compare_digest(sent.encode(), expected.encode())
        ):
            return self.pages.render(
                request,
                "refused.html",
                403,
                title="refused",
                message="this form has no valid CSRF token: nothing was changed. Reload the "
                "sign-in page and submit it from there.",
            )
        name, password = str(form.get("name", "")), str(form.get("password", ""))
        operator = await run_in_threadpool(accounts.authenticate, name, password)
        if operator is None:
            log.warning("console: failed sign-in for %r from %s", name[:120], request.client)
            return self._login_page(
                request,
                401,
                next=safe_next(str(form.get("next", "/"))),
                error="wrong name or password, or the account is disabled",
            )
        token, _ = await run_in_threadpool(
            accounts.start_session, operator, lifetime=cfg.session_lifetime
        )
        response = RedirectResponse(safe_next(str(form.get("next", "/"))), status_code=303)
        self.sessions.set_session_cookie(request, response, token)
        response.delete_cookie(LOGIN_COOKIE)
        return response

    def logout(self, request: Request, auth: Auth, form: Any) -> Response:
        self.sessions.accounts.end_session(request.cookies.get(SESSION_COOKIE, ""))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response


def safe_next(url: str) -> str:
    """Only a path on this site (never another host) after signing in."""
    if not url.startswith("/") or url.startswith("//") or "\\" in url:
        return "/"
    return url
