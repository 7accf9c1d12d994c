"""A provider that hangs every call: a loopback server that accepts each connection and
never answers (development tooling: the bench's provider-pressure part and the tests).

```python
with hanging_server() as (port, accepted):   # listens on 127.0.0.1, a free port
    ...                                      # len(accepted): connections it took
```

Leaving the block closes every connection it accepted and joins its thread."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["hanging_server"]


@contextmanager
def hanging_server() -> Iterator[tuple[int, list[socket.socket]]]:
    """The server's port, and the connections it accepted (kept open until the end)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(conn)

    thread = threading.Thread(target=serve, name="hanging-provider", daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()
