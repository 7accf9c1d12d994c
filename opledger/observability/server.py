"""`opledger metrics`: the Prometheus endpoint, behind the same basic auth as Flower.

It serves `/metrics`: the workers' counters, added up from `PROMETHEUS_MULTIPROC_DIR`,
and the ledger's gauges, read on each scrape. Like `opledger flower` it never runs without
a password (`OPLEDGER_FLOWER_PASSWORD`, user `OPLEDGER_FLOWER_USER`: Prometheus's one
`basic_auth` scrapes both), binds to 127.0.0.1 unless told otherwise, and answers a
missing or wrong password with 401 and a `WWW-Authenticate` challenge.
"""

from __future__ import annotations

import base64
import hmac
import os
from collections.abc import Collection
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from .ledger_gauges import LedgerCollector, configured_actions
from .metrics import MULTIPROC_ENV


def registry_for(engine: Any, actions: Collection[str] | None = None) -> CollectorRegistry:
    """The ledger's gauges, plus the workers' counters when the directory is set.
    `actions` (the served ones) adds `opledger_operations_unserved`."""
    registry = CollectorRegistry(auto_describe=False)
    directory = os.environ.get(MULTIPROC_ENV)
    if directory:
        MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    registry.register(LedgerCollector(engine, actions))
    return registry


def _credentials(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


class Served(Enum):
    #: `make_server`'s default: the actions of the adapters `OPLEDGER_ADAPTERS` configures
    CONFIGURED = "configured"


def make_server(
    engine: Any,
    *,
    user: str,
    password: str,
    address: str = "127.0.0.1",
    port: int = 9464,
    actions: Collection[str] | Served | None = Served.CONFIGURED,
) -> ThreadingHTTPServer:
    """An HTTP server for /metrics (not yet serving: call `serve_forever`).

    `actions` are the actions counted as served for `opledger_operations_unserved`: by
    default the configured adapters' (`OPLEDGER_ADAPTERS`, read once here); None leaves
    that gauge out."""
    served = configured_actions() if actions is Served.CONFIGURED else actions
    registry = registry_for(engine, served)
    expected = _credentials(user, password)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            given = (self.headers.get("Authorization") or "").encode()
            if not hmac.compare_digest(given, expected):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="opledger metrics"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: scraped often
            pass

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    return server
