"""Who a console request acts for: the session cookie (or the trusted SSO header), the
CSRF token every form carries, the cookies' names and attributes, and which client a
request comes from. Blocking calls (they read the database): run them in the threadpool."""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from ipaddress import ip_address, ip_network
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .accounts import Accounts, Operator, Session
from .base import ConsoleConfig, Refusal

log = logging.getLogger("opledger.console")

SESSION_COOKIE = "opledger_session"
LOGIN_COOKIE = "opledger_login"
#: over HTTPS: only a secure page of this very host, at path /, can set such a cookie
HOST_PREFIX = "__Host-"


@dataclass
class Auth:
    session: Session
    new_token: str | None = None  #: a session started on this request (trusted header)
    #: how many approvals wait for this operator (the nav's count; None: not counted)
    approvals_waiting: int | None = None

    @property
    def operator(self) -> Operator:
        return self.session.operator


class Sessions:
    """Authentication: the request's session, in password or trusted-header mode."""

    def __init__(self, accounts: Accounts, config: ConsoleConfig) -> None:
        self.accounts = accounts
        self.config = config
        self._proxies = [ip_network(p, strict=False) for p in config.trusted_proxies]
        prefix = HOST_PREFIX if config.https else ""
        self.session_cookie, self.login_cookie = prefix + SESSION_COOKIE, prefix + LOGIN_COOKIE

    def secure(self, request: Request) -> bool:
        """Whether cookies are sent over HTTPS only."""
        return self.config.https or request.url.scheme == "https"

    def session_token(self, request: Request) -> str:
        return request.cookies.get(self.session_cookie, "")

    def set_session_cookie(self, request: Request, response: Response, token: str) -> None:
        response.set_cookie(
            self.session_cookie,
            token,
            max_age=int(self.config.session_lifetime.total_seconds()),
            httponly=True,
            samesite="strict",
            secure=self.secure(request),
            path="/",
        )

    def _from_proxy(self, request: Request) -> bool:
        host = request.client.host if request.client else ""
        try:
            address = ip_address(host)
        except ValueError:
            return host in self.config.trusted_proxies  # a name such as a test client's
        return any(address in net for net in self._proxies)

    def client_address(self, request: Request) -> str:
        """The client's address: the peer's, or behind a trusted proxy, the last address
        its X-Forwarded-For names (the one the proxy itself saw)."""
        peer = request.client.host if request.client else "unknown"
        if self._proxies and self._from_proxy(request):
            forwarded = ",".join(request.headers.getlist("x-forwarded-for"))
            last = forwarded.rsplit(",", 1)[-1].strip()
            if last:
                return last[:100]
        return peer

    def authenticate(self, request: Request) -> Auth | None:
        """The session of this request, or None (not signed in). Blocking: threadpool."""
        cfg, accounts = self.config, self.accounts
        token = self.session_token(request)
        session = accounts.session(token, idle=cfg.idle_timeout) if token else None
        if cfg.trusted_header is None:
            return Auth(session) if session else None
        if not self._from_proxy(request):
            raise Refusal(
                403,
                "refused",
                f"this console trusts the {cfg.trusted_header} header only from its SSO "
                "proxy: connect through the proxy",
            )
        names = request.headers.getlist(cfg.trusted_header)
        if len(names) > 1:
            log.warning(
                "console: refused a request with %d %s headers from %s",
                len(names),
                cfg.trusted_header,
                request.client.host if request.client else "?",
            )
            raise Refusal(
                400,
                "refused",
                f"the request has {len(names)} {cfg.trusted_header} headers: the SSO proxy "
                "must send exactly one",
            )
        name = names[0].strip() if names else ""
        if not name:
            raise Refusal(
                401, "not signed in", f"the SSO proxy sent no {cfg.trusted_header} header"
            )
        if session is not None and session.operator.name == name:
            return Auth(session)
        operator = accounts.operator(name)
        if operator is None:
            raise Refusal(
                403,
                "refused",
                f"{name!r} is no enabled operator of this console: ask an admin to run "
                f"`opledger operator add {name} --tenant TENANT --sso-only`",
            )
        token, session = accounts.start_session(operator, lifetime=cfg.session_lifetime)
        return Auth(session, new_token=token)

    @staticmethod
    def check_csrf(auth: Auth, form: Any) -> None:
        sent = form.get("csrf_token")
        if not isinstance(sent, str) or not hmac.compare_digest(
            sent.encode(), auth.session.csrf_token.encode()
        ):
            raise Refusal(
                403,
                "refused",
                "this form has no valid CSRF token: nothing was changed. Reload the page "
                "and submit it from there.",
            )
