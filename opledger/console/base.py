"""What every part of the review console shares: its configuration, the refusal a page
renders, and the security headers every answer carries."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from starlette.responses import Response

from .redaction import Redaction

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'; "
    "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class ConsoleConfig:
    #: an idle session ends after this long without a request
    idle_timeout: timedelta = timedelta(minutes=30)
    #: and any session after this long
    session_lifetime: timedelta = timedelta(hours=8)
    #: trusted-header mode: the header an SSO proxy sets to the signed-in operator's name
    trusted_header: str | None = None
    #: the addresses such a proxy connects from (nobody else may set the header)
    trusted_proxies: tuple[str, ...] = ("127.0.0.1", "::1")
    #: cookies only over HTTPS (set it behind a TLS-terminating proxy)
    secure_cookies: bool = False
    redaction: Redaction = field(default_factory=Redaction)


class Refusal(Exception):
    """An HTTP refusal rendered as a page: status, title, message."""

    def __init__(self, status: int, title: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.title, self.message, self.extra = status, title, message, extra


def not_found() -> Refusal:
    return Refusal(404, "not found", "not found")


def secured(response: Response) -> Response:
    """The response with the console's security headers (those it does not set itself)."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response
