"""The security headers of every answer the console gives (pages, redirects, refusals,
its own 404s and 500s, static files), added once here rather than per route."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'; "
    "base-uri 'none'",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
}

#: pages hold operators' data: no copy is kept by the browser or anything on the way
NO_STORE = ("cache-control", "no-store")


class SecurityHeaders:
    """ASGI middleware: the headers above on every HTTP answer (those the answer does not
    set itself), and `Cache-Control: no-store` on everything but the static files."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        wanted = dict(SECURITY_HEADERS)
        if not scope["path"].startswith("/static/"):
            wanted.setdefault(*NO_STORE)

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [
                    (name.encode(), value.encode())
                    for name, value in wanted.items()
                    if name.encode() not in present
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_secured)
