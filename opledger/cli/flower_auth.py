"""Flower's /metrics and /healthcheck behind the same basic auth as the rest of Flower.

Flower 2.x checks `--basic-auth` only in handlers marked `@tornado.web.authenticated` (the
pages) and in its API handlers; its Prometheus `/metrics` and its `/healthcheck` are plain
handlers that answer anyone, credentials or not. `opledger flower` wraps their `prepare`
so they ask for the same credentials: Flower's own `get_current_user` answers 401 (with a
`WWW-Authenticate` challenge) to a missing or wrong password. Prometheus scrapes with
`basic_auth` in its scrape config; a health probe sends the same header.

If a Flower version moves or renames these handlers, `opledger flower` refuses to start
rather than serve them open.
"""

from __future__ import annotations

from typing import Any

PROTECTED = ("/metrics", "/healthcheck")


def require_auth_everywhere() -> None:
    """Make Flower's /metrics and /healthcheck handlers require its configured auth."""
    import tornado.web
    from flower import urls

    handlers: dict[str, Any] = {
        spec[0]: spec[1] for spec in urls.handlers if isinstance(spec, tuple) and len(spec) >= 2
    }
    missing = [path for path in PROTECTED if path not in handlers]
    if missing:
        raise RuntimeError(
            f"Flower serves no {', '.join(missing)} where opledger expects it: this Flower "
            "version is not one opledger knows how to protect; refusing to start it"
        )
    for path in PROTECTED:
        handler = handlers[path]
        if getattr(handler, "_opledger_auth", False):
            continue
        original = handler.prepare

        def prepare(self: tornado.web.RequestHandler, _original: Any = original) -> Any:
            if not self.current_user:  # Flower's check: raises 401 on wrong basic auth
                raise tornado.web.HTTPError(401)
            return _original(self)

        handler.prepare = prepare
        handler._opledger_auth = True
