"""What every part of the review console shares: its configuration and the refusal a page
renders."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from opledger.ledger.errors import InvalidInput

from .redaction import Redaction
from .throttle import ThrottlePolicy


def public_origin(url: str) -> str:
    """The origin (`scheme://host[:port]`) of the console's public URL; InvalidInput if
    it is not an http(s) URL of a host alone."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"a public URL is http(s)://host[:port], not {url!r}", field="url")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise InvalidInput(
            f"a public URL names the console's host alone (it is served at /), not {url!r}",
            field="url",
        )
    default = {"http": 80, "https": 443}[parts.scheme]
    port = "" if parts.port in (None, default) else f":{parts.port}"
    return f"{parts.scheme}://{parts.hostname.lower()}{port}"


@dataclass(frozen=True)
class ConsoleConfig:
    #: an idle session ends after this long without a request
    idle_timeout: timedelta = timedelta(minutes=30)
    #: and any session after this long
    session_lifetime: timedelta = timedelta(hours=8)
    #: trusted-header mode: the header an SSO proxy sets to the signed-in operator's name
    trusted_header: str | None = None
    #: the addresses such a proxy connects from (nobody else may set the header); their
    #: X-Forwarded-For names the client whose sign-ins are counted
    trusted_proxies: tuple[str, ...] = ()
    #: cookies only over HTTPS (set it behind a TLS-terminating proxy)
    secure_cookies: bool = False
    #: the origin browsers see (`https://review.example.com`) when a proxy sits in front;
    #: None: the request's own scheme and Host
    public_origin: str | None = None
    #: when sign-in attempts wait, and how many password checks run at once
    throttle: ThrottlePolicy = field(default_factory=ThrottlePolicy)
    password_checks: int = 2
    #: signs the sign-in form's nonce (several console processes behind one name share it)
    signin_key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    redaction: Redaction = field(default_factory=Redaction)

    def __post_init__(self) -> None:
        if self.trusted_header and not self.trusted_proxies:
            raise InvalidInput(
                "a trusted header needs the SSO proxy's addresses (--trusted-proxy): "
                "without them any local process could name any operator",
                field="trusted_proxies",
            )
        if self.public_origin is not None:
            object.__setattr__(self, "public_origin", public_origin(self.public_origin))
        if self.password_checks < 1:
            raise InvalidInput("at least one password check at a time", field="password_checks")
        if len(self.signin_key) < 16:
            raise InvalidInput("the sign-in key needs at least 16 bytes", field="signin_key")

    @property
    def https(self) -> bool:
        """Whether browsers reach the console over HTTPS only (cookies are then Secure and
        `__Host-` prefixed)."""
        return self.secure_cookies or (self.public_origin or "").startswith("https://")


class Refusal(Exception):
    """An HTTP refusal rendered as a page: status, title, message."""

    def __init__(
        self,
        status: int,
        title: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status, self.title, self.message, self.extra = status, title, message, extra
        self.headers = headers or {}


def not_found() -> Refusal:
    return Refusal(404, "not found", "not found")
