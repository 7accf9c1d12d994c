"""Signing in and out of the review console (password mode; in trusted-header mode the SSO
proxy signs operators in).

The sign-in form carries a nonce that the server signed (`signin_key`), also set as a
cookie: a cookie some other page planted (another port of this host can set one: cookies
ignore ports) holds no valid signature. Together with `origins.OriginCheck`, which refuses
a form posted from any page but the console's own, nobody can sign a browser in as
someone else.

A password check costs an argon2 hash (64 MiB, tens of milliseconds), so attempts are
throttled before it runs (`throttle`, from the failures on record for the name and the
address: 429 and when to retry) and at most `password_checks` run at once in a process
(beyond that: 503 at once, never a queue).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import math
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from .accounts import Operator
from .base import Refusal
from .sessions import Auth, Sessions
from .throttle import retry_at
from .web import Pages

log = logging.getLogger("opledger.console")

#: a sign-in form older than this is refused (reload it)
NONCE_LIFETIME_SECONDS = 2 * 3600

WRONG = "wrong name or password, or the account is disabled"


class SignIn:
    """`/login` (GET: the form; POST: check the password, start a session) and `/logout`."""

    def __init__(self, pages: Pages, sessions: Sessions) -> None:
        self.pages, self.sessions = pages, sessions
        self.config = sessions.config
        self._checks = asyncio.Semaphore(self.config.password_checks)

    # -- the form's nonce ---------------------------------------------------------------

    def _sign(self, body: str) -> str:
        mac = hmac.new(self.config.signin_key, body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def new_nonce(self) -> str:
        body = f"{secrets.token_urlsafe(24)}.{int(time.time())}"
        return f"{body}.{self._sign(body)}"

    def nonce_is_valid(self, sent: object, cookie: str) -> bool:
        """The form's nonce is the cookie's, this server signed it, and it is recent."""
        if not (isinstance(sent, str) and cookie and len(sent) < 200):
            return False
        if not hmac.compare_digest(sent.encode(), cookie.encode()):
            return False
        body, _, mac = sent.rpartition(".")
        stamp = body.rpartition(".")[2]
        if not (body and stamp.isdigit() and hmac.compare_digest(mac, self._sign(body))):
            return False
        return 0 <= time.time() - int(stamp) <= NONCE_LIFETIME_SECONDS

    def _login_page(self, request: Request, status: int = 200, **ctx: Any) -> Response:
        nonce = self.new_nonce()
        response: Response = self.pages.render(request, "login.html", status, nonce=nonce, **ctx)
        response.set_cookie(
            self.sessions.login_cookie,
            nonce,
            max_age=NONCE_LIFETIME_SECONDS,
            httponly=True,
            samesite="strict",
            secure=self.sessions.secure(request),
            path="/",
        )
        return response

    # -- the endpoints ------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        cfg = self.config
        if request.method == "GET":
            if cfg.trusted_header:
                return RedirectResponse("/", status_code=303)
            return self._login_page(request, next=safe_next(request.query_params.get("next", "/")))
        if cfg.trusted_header:
            return self.pages.refused(
                request, Refusal(403, "refused", "sign in through the SSO proxy")
            )
        form = await request.form()
        if not self.nonce_is_valid(
            form.get("csrf_token"), request.cookies.get(self.sessions.login_cookie, "")
        ):
            return self.pages.refused(
                request,
                Refusal(
                    403,
                    "refused",
                    "this form has no valid CSRF token: nothing was changed. Reload the "
                    "sign-in page and submit it from there.",
                ),
            )
        name, password = str(form.get("name", "")), str(form.get("password", ""))
        next_url = safe_next(str(form.get("next", "/")))
        address = self.sessions.client_address(request)
        failures = await run_in_threadpool(
            self.sessions.accounts.signin_failures, name, address, window=cfg.throttle.window
        )
        until = retry_at(cfg.throttle, failures)
        if until is not None:
            log.warning(
                "console: sign-in for %r from %s refused until %s (%d failures of the name, "
                "%d of the address)",
                name[:120],
                address,
                until.isoformat(timespec="seconds"),
                failures.operator,
                failures.address,
            )
            return self._wait(request, next_url, until, failures.now)
        if self._checks.locked():
            response = self._login_page(
                request,
                503,
                next=next_url,
                error="the console is checking other sign-ins right now: try again in a second",
            )
            response.headers["Retry-After"] = "1"
            return response
        async with self._checks:
            operator = await run_in_threadpool(self._check, name, password, address)
        if operator is None:
            log.warning("console: failed sign-in for %r from %s", name[:120], address)
            return self._login_page(request, 401, next=next_url, error=WRONG)
        token, _ = await run_in_threadpool(
            self.sessions.accounts.start_session, operator, lifetime=cfg.session_lifetime
        )
        response = RedirectResponse(next_url, status_code=303)
        self.sessions.set_session_cookie(request, response, token)
        self._forget(request, response, self.sessions.login_cookie)
        return response

    def _check(self, name: str, password: str, address: str) -> Operator | None:
        accounts = self.sessions.accounts
        operator = accounts.authenticate(name, password)
        accounts.record_signin(name, address, ok=operator is not None)
        return operator

    def _wait(self, request: Request, next_url: str, until: datetime, now: datetime) -> Response:
        seconds = max(1, math.ceil((until - now).total_seconds()))
        until = until.astimezone(UTC)
        response = self._login_page(
            request,
            429,
            next=next_url,
            error=f"too many failed sign-ins for this name or from this address: try again "
            f"after {until:%H:%M:%S} UTC (in {seconds} s)",
            retry_at=until,
        )
        response.headers["Retry-After"] = str(seconds)
        return response

    def logout(self, request: Request, auth: Auth, form: Any) -> Response:
        self.sessions.accounts.end_session(self.sessions.session_token(request))
        response = RedirectResponse("/login", status_code=303)
        self._forget(request, response, self.sessions.session_cookie)
        return response

    def _forget(self, request: Request, response: Response, cookie: str) -> None:
        response.delete_cookie(
            cookie, path="/", secure=self.sessions.secure(request), httponly=True
        )


def safe_next(url: str) -> str:
    """Only a path on this site (never another host) after signing in."""
    if not url.startswith("/") or url.startswith("//") or "\\" in url:
        return "/"
    return url
