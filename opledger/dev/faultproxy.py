"""A TCP fault proxy: forwards loopback connections to an upstream server and breaks them
on request, so a test can lose a provider's answer *after* the provider acted on it.

```python
with FaultProxy(("127.0.0.1", upstream_port)) as proxy:   # listens on 127.0.0.1, a free port
    proxy.cut_response(after=b"\\r\\n.\\r\\n", times=1)
    proxy.delay_response(2.0, after=b"", times=1)
    proxy.refuse(times=1)
    proxy.clear()
    proxy.connections, proxy.fired
```

A fault applies to the next `times` new client connections (`times=None`: to every new one
until `clear()`); a connection takes the faults armed when it is accepted, so a kept-alive
connection opened before a fault was armed is left alone. `after` is a byte pattern the
client must have sent on that connection (matched across TCP segments; b"" = from the
start) before the fault acts on the server's answer:

- `cut_response`: the client's bytes reach the server; the server's next bytes after the
  pattern are dropped and both sockets closed (the request arrived, its answer is lost);
- `delay_response`: the server's next bytes after the pattern are held for `seconds`, then
  forwarded with everything after them;
- `refuse`: the connection is accepted and closed at once, never connected upstream.

Threads and sockets only (stdlib). Leaving the `with` block closes every socket and joins
every thread the proxy started.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from dataclasses import dataclass, field
from types import TracebackType

__all__ = ["FaultProxy"]

_CHUNK = 65536
_POLL = 0.05  # how often a blocked thread looks at the stop flag (seconds)


@dataclass
class _Fault:
    kind: str  # "cut" | "delay" | "refuse"
    after: bytes = b""
    seconds: float = 0.0
    remaining: int | None = None  # connections left; None = until clear()


@dataclass
class _Armed:
    """One fault as one connection carries it."""

    kind: str
    after: bytes
    seconds: float
    seen: threading.Event = field(default_factory=threading.Event)
    done: bool = False


class _Connection:
    """A client connection and its upstream, with two pumps between them."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, faults: list[_Armed]) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        self.faults = faults
        self.tail = b""  # the client's last bytes, for patterns split across segments
        self.threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._pumps_done = 0
        for fault in faults:
            if not fault.after:
                fault.seen.set()

    def start(self) -> None:
        runner = threading.Thread(target=self._run, name="faultproxy-c2s", daemon=True)
        self.threads.append(runner)
        runner.start()

    def _run(self) -> None:
        try:
            self.upstream = socket.create_connection(self.proxy.upstream, timeout=5.0)
        except OSError:
            self.close()
            return
        self.upstream.settimeout(None)
        if self._closed.is_set():  # stopped while connecting
            self.upstream.close()
            return
        server = threading.Thread(target=self._pump_server, name="faultproxy-s2c", daemon=True)
        with self._lock:
            self.threads.append(server)
        server.start()
        self._pump_client()

    def _pump_done(self) -> None:
        """One direction is over; when both are, the connection is."""
        with self._lock:
            self._pumps_done += 1
            both = self._pumps_done == 2
        if both:
            self.close()

    # -- client -> server ------------------------------------------------------------------

    def _pump_client(self) -> None:
        assert self.upstream is not None
        while True:
            data = self._recv(self.client)
            if data is None:  # error or stop
                self.close()
                return
            if not data:  # the client half-closed: pass it on
                _shutdown(self.upstream, socket.SHUT_WR)
                self._pump_done()
                return
            self._watch(data)  # before forwarding: the answer may come back at once
            try:
                self.upstream.sendall(data)
            except OSError:
                self.close()
                return

    def _watch(self, data: bytes) -> None:
        stream = self.tail + data
        longest = 0
        for fault in self.faults:
            if fault.after and not fault.seen.is_set():
                longest = max(longest, len(fault.after))
                if fault.after in stream:
                    fault.seen.set()
        self.tail = stream[-(longest - 1) :] if longest > 1 else b""

    # -- server -> client ------------------------------------------------------------------

    def _pump_server(self) -> None:
        assert self.upstream is not None
        while True:
            data = self._recv(self.upstream)
            if data is None:
                self.close()
                return
            if not data:
                if self._cutting():  # the server closed after the pattern: so do we
                    self.proxy._fired("cut")
                    self.close()
                    return
                _shutdown(self.client, socket.SHUT_WR)
                self._pump_done()
                return
            if self._cutting():
                self.proxy._fired("cut")
                self.close()
                return
            for fault in self.faults:
                if fault.kind == "delay" and fault.seen.is_set() and not fault.done:
                    fault.done = True
                    self.proxy._fired("delay")
                    if self.proxy._stop.wait(fault.seconds) or self._closed.is_set():
                        self.close()
                        return
            try:
                self.client.sendall(data)
            except OSError:
                self.close()
                return

    def _cutting(self) -> bool:
        return any(f.kind == "cut" and f.seen.is_set() for f in self.faults)

    # -- plumbing --------------------------------------------------------------------------

    def _recv(self, sock: socket.socket) -> bytes | None:
        """The next bytes from `sock`, b"" at its end, None on an error or when stopping."""
        while not self._closed.is_set() and not self.proxy._stop.is_set():
            try:
                ready, _, _ = select.select([sock], [], [], _POLL)
            except (OSError, ValueError):
                return None
            if not ready:
                continue
            try:
                return sock.recv(_CHUNK)
            except OSError:
                return None
        return None

    def close(self) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
        for sock in (self.client, self.upstream):
            if sock is not None:
                _shutdown(sock, socket.SHUT_RDWR)
                sock.close()

    def over(self) -> bool:
        """Closed, and every thread of it finished."""
        with self._lock:
            threads = list(self.threads)
        return self._closed.is_set() and not any(t.is_alive() for t in threads)

    def join(self, timeout: float) -> None:
        with self._lock:
            threads = list(self.threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)


def _shutdown(sock: socket.socket, how: int) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(how)


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of `upstream` that injects faults on request."""

    def __init__(self, upstream: tuple[str, int], host: str = "127.0.0.1", port: int = 0) -> None:
        """`port`: where to listen (0: a free port, chosen at each `start`). A fixed port
        lets a client be pointed at an address that refuses connections until the proxy
        starts there (the provider comes back); it may be bound again right after `stop`."""
        self.upstream = upstream
        self._host = host
        self._port = port
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._live: list[_Connection] = []
        self._connections = 0
        self._fired_counts: dict[str, int] = {"cut": 0, "delay": 0, "refuse": 0}
        self.port = port

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        if self._listener is not None:
            raise RuntimeError("the fault proxy is already running")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # a fixed port can be bound again while the last run's connections are in TIME_WAIT
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self._host, self._port))
        except OSError:  # the fixed port is taken
            listener.close()
            raise
        listener.listen(64)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._stop.clear()
        self._acceptor = threading.Thread(target=self._accept, name="faultproxy", daemon=True)
        self._acceptor.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._acceptor is not None:
            self._acceptor.join(timeout)
            self._acceptor = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._lock:
            live, self._live = self._live, []
        for conn in live:
            conn.close()
        for conn in live:
            conn.join(timeout)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def address(self) -> tuple[str, int]:
        return (self._host, self.port)

    @property
    def connections(self) -> int:
        """How many client connections the proxy accepted (refused ones included)."""
        with self._lock:
            return self._connections

    @property
    def fired(self) -> dict[str, int]:
        """How often each fault acted: answers cut, answers delayed, connections refused."""
        with self._lock:
            return dict(self._fired_counts)

    # -- faults ----------------------------------------------------------------------------

    def cut_response(self, after: bytes = b"", times: int | None = 1) -> None:
        """Forward the client's bytes; once it has sent `after`, drop the server's next
        bytes and close both sockets."""
        self._arm(_Fault("cut", after=bytes(after), remaining=times))

    def delay_response(self, seconds: float, after: bytes = b"", times: int | None = 1) -> None:
        """Hold the server's next bytes after `after` for `seconds`, then forward them."""
        if seconds < 0:
            raise ValueError("a delay cannot be negative")
        self._arm(_Fault("delay", after=bytes(after), seconds=seconds, remaining=times))

    def refuse(self, times: int | None = 1) -> None:
        """Accept the next connections and close them at once, never connecting upstream.

        The client's connect succeeds and it then reads a closed connection: to an HTTP
        client that is a lost connection after connecting (ambiguous), not a refused one
        (nothing sent). A refused connection is a port nothing listens on."""
        self._arm(_Fault("refuse", remaining=times))

    def clear(self) -> None:
        """Drop every armed fault: plain forwarding for new connections."""
        with self._lock:
            self._faults.clear()

    def close_connections(self) -> None:
        """Close every connection open now, both sides: a client's next request opens a new
        one, which carries the faults armed then (a client that keeps connections alive
        would otherwise send it on an old one, which carries none). Only while the client
        sends nothing: a request under way loses its answer."""
        with self._lock:
            live = list(self._live)
        for conn in live:
            conn.close()

    def _arm(self, fault: _Fault) -> None:
        if fault.remaining is not None and fault.remaining < 0:
            raise ValueError("times must be None or at least 0")
        if fault.remaining == 0:
            return
        with self._lock:
            self._faults.append(fault)

    def _take_faults(self) -> list[_Armed]:
        """The faults the next connection carries (the lock is held)."""
        taken = []
        for fault in self._faults:
            taken.append(_Armed(fault.kind, fault.after, fault.seconds))
            if fault.remaining is not None:
                fault.remaining -= 1
        self._faults = [f for f in self._faults if f.remaining is None or f.remaining > 0]
        return taken

    def _fired(self, kind: str) -> None:
        with self._lock:
            self._fired_counts[kind] += 1

    # -- accepting -------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._listener is not None
        listener = self._listener
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([listener], [], [], _POLL)
            except (OSError, ValueError):
                return
            if not ready:
                continue
            try:
                client, _ = listener.accept()
            except OSError:
                continue
            with self._lock:
                self._connections += 1
                faults = self._take_faults()
                refused = any(f.kind == "refuse" for f in faults)
                if refused:
                    self._fired_counts["refuse"] += 1
                # forget connections that are over, so a long run does not grow the list
                self._live = [c for c in self._live if not c.over()]
            if refused:
                _shutdown(client, socket.SHUT_RDWR)
                client.close()
                continue
            conn = _Connection(self, client, [f for f in faults if f.kind != "refuse"])
            with self._lock:
                self._live.append(conn)
            conn.start()
