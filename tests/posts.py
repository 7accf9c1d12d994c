"""A receiver of HTTP POSTs on loopback, for the tests of what opledger posts (signed
webhooks): each request handed to the test's own `handle`, answered with its status."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: what a test does with one POST: its headers (names in lower case) and body, to a status
Handle = Callable[[dict[str, str], bytes], int]


@contextmanager
def receiving(handle: Handle, path: str = "/") -> Iterator[str]:
    """Serve POSTs at `path` on loopback until the block ends: the URL. A `handle` that
    raises answers 500."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            try:
                status = handle({k.lower(): v for k, v in self.headers.items()}, body)
            except Exception:
                status = 500
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{path}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
