"""The TCP fault proxy against a real line server on loopback: what reaches the server, what
comes back, and what is left running afterwards."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from opledger.dev.faultproxy import FaultProxy
from opledger.dev.processes import wait_until


class LineServer(socketserver.ThreadingTCPServer):
    """Answers each line `x` with `ok x`; counts connections and the lines it received."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), LineHandler)
        self.lines: list[bytes] = []
        self.accepted = 0
        self.lock = threading.Lock()


class LineHandler(socketserver.StreamRequestHandler):
    server: LineServer

    def handle(self) -> None:
        with self.server.lock:
            self.server.accepted += 1
        for line in self.rfile:
            with self.server.lock:
                self.server.lines.append(line)
            self.wfile.write(b"ok " + line)


@pytest.fixture
def upstream() -> Iterator[LineServer]:
    server = LineServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def proxy(upstream: LineServer) -> Iterator[FaultProxy]:
    with FaultProxy(upstream.server_address[:2]) as p:  # type: ignore[arg-type]
        yield p


def connect(proxy: FaultProxy) -> socket.socket:
    sock = socket.create_connection(proxy.address, timeout=5)
    return sock


def read_line(sock: socket.socket) -> bytes:
    """One answer line, or b"" when the proxy closed the connection first."""
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    return data


def ask(proxy: FaultProxy, line: bytes) -> bytes:
    with connect(proxy) as sock:
        sock.sendall(line)
        return read_line(sock)


def seen(predicate: Callable[[], object]) -> None:
    wait_until(predicate, 5.0, "the upstream server to see it", every=0.01)


def test_forwards_both_ways_and_counts_connections(proxy: FaultProxy, upstream: LineServer) -> None:
    assert proxy.address == ("127.0.0.1", proxy.port) and proxy.port > 0
    assert ask(proxy, b"one\n") == b"ok one\n"
    with connect(proxy) as sock:
        for word in (b"two\n", b"three\n"):
            sock.sendall(word)
            assert read_line(sock) == b"ok " + word
    assert proxy.connections == 2
    assert upstream.lines == [b"one\n", b"two\n", b"three\n"]
    assert proxy.fired == {"cut": 0, "delay": 0, "refuse": 0}


def test_large_payload_passes_intact(proxy: FaultProxy) -> None:
    line = b"x" * 1_000_000 + b"\n"
    proxy.cut_response(after=b"never-sent", times=None)  # watched, never matched
    assert ask(proxy, line) == b"ok " + line
    assert proxy.fired["cut"] == 0


def test_cut_from_the_start_delivers_the_request_and_loses_the_answer(
    proxy: FaultProxy, upstream: LineServer
) -> None:
    proxy.cut_response(after=b"", times=1)
    assert ask(proxy, b"charge\n") == b""
    wait_until(
        lambda: upstream.lines == [b"charge\n"], 5.0, "the server to see it", every=0.01
    )  # the request reached the server
    assert proxy.fired["cut"] == 1
    assert ask(proxy, b"again\n") == b"ok again\n"  # times=1: the next one is plain


def test_cut_after_a_pattern_split_across_segments(proxy: FaultProxy, upstream: LineServer) -> None:
    proxy.cut_response(after=b"COMMIT\r\n", times=1)
    with connect(proxy) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(b"BEGIN\n")
        assert read_line(sock) == b"ok BEGIN\n"  # before the pattern: forwarded
        sock.sendall(b"COM")
        time.sleep(0.1)  # two segments: the pattern is split between them
        sock.sendall(b"MIT\r\n")
        assert read_line(sock) == b""
    wait_until(
        lambda: upstream.lines == [b"BEGIN\n", b"COMMIT\r\n"],
        5.0,
        "the server to see it",
        every=0.01,
    )
    assert proxy.fired["cut"] == 1


def test_a_pattern_split_across_many_tiny_segments(proxy: FaultProxy) -> None:
    proxy.cut_response(after=b"\r\n.\r\n", times=1)
    with connect(proxy) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for byte in b"body\r\n.\r\n":
            sock.sendall(bytes([byte]))
            time.sleep(0.01)
        # the server answers each line: the first came before the pattern was complete
        assert read_line(sock) == b"ok body\r\n"
        assert read_line(sock) == b""
    assert proxy.fired["cut"] == 1


def test_times_none_applies_until_clear(proxy: FaultProxy, upstream: LineServer) -> None:
    proxy.cut_response(after=b"pay", times=None)
    assert ask(proxy, b"pay 1\n") == b""
    assert ask(proxy, b"pay 2\n") == b""
    assert ask(proxy, b"look\n") == b"ok look\n"  # the pattern never came
    proxy.clear()
    assert ask(proxy, b"pay 3\n") == b"ok pay 3\n"
    wait_until(
        lambda: sorted(upstream.lines) == [b"look\n", b"pay 1\n", b"pay 2\n", b"pay 3\n"],
        5.0,
        "the server to see it",
        every=0.01,
    )
    assert proxy.fired["cut"] == 2


def test_times_counts_new_connections(proxy: FaultProxy) -> None:
    proxy.cut_response(times=2)
    assert [ask(proxy, b"a\n") for _ in range(3)] == [b"", b"", b"ok a\n"]


def test_a_fault_skips_connections_opened_before_it(proxy: FaultProxy) -> None:
    with connect(proxy) as old:
        old.sendall(b"first\n")
        assert read_line(old) == b"ok first\n"
        proxy.cut_response(times=1)
        old.sendall(b"second\n")
        assert read_line(old) == b"ok second\n"
    assert ask(proxy, b"third\n") == b""


def test_delay_holds_the_answer_then_forwards_it(proxy: FaultProxy, upstream: LineServer) -> None:
    proxy.delay_response(0.6, after=b"slow", times=1)
    with connect(proxy) as sock:
        sock.sendall(b"fast\n")
        started = time.monotonic()
        assert read_line(sock) == b"ok fast\n"
        assert time.monotonic() - started < 0.5
        sock.sendall(b"slow\n")
        started = time.monotonic()
        wait_until(
            lambda: b"slow\n" in upstream.lines, 5.0, "the server to see it", every=0.01
        )  # the server has it at once
        assert read_line(sock) == b"ok slow\n"
        assert time.monotonic() - started >= 0.55
        sock.sendall(b"after\n")  # held once: the rest flows
        started = time.monotonic()
        assert read_line(sock) == b"ok after\n"
        assert time.monotonic() - started < 0.5
    assert proxy.fired["delay"] == 1


def test_a_client_that_gives_up_during_a_delay(proxy: FaultProxy, upstream: LineServer) -> None:
    proxy.delay_response(1.0, times=1)
    with connect(proxy) as sock:
        sock.settimeout(0.2)
        sock.sendall(b"charge\n")
        with pytest.raises(TimeoutError):
            sock.recv(10)
    seen(lambda: upstream.lines == [b"charge\n"])
    assert ask(proxy, b"next\n") == b"ok next\n"


def test_refuse_closes_without_connecting_upstream(proxy: FaultProxy, upstream: LineServer) -> None:
    proxy.refuse(times=1)
    assert ask(proxy, b"hello\n") == b""
    assert ask(proxy, b"hello\n") == b"ok hello\n"
    assert proxy.connections == 2
    assert upstream.accepted == 1 and upstream.lines == [b"hello\n"]
    assert proxy.fired["refuse"] == 1


def test_invalid_arguments(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError):
        proxy.delay_response(-1)
    with pytest.raises(ValueError):
        proxy.cut_response(times=-1)
    proxy.cut_response(times=0)  # nothing armed
    assert ask(proxy, b"a\n") == b"ok a\n"


def test_upstream_down_closes_the_client(upstream: LineServer) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    with FaultProxy(("127.0.0.1", free)) as proxy:
        assert ask(proxy, b"a\n") == b""
        assert proxy.connections == 1


def test_clean_shutdown_leaves_no_threads_or_listener(upstream: LineServer) -> None:
    before = set(threading.enumerate())
    proxy = FaultProxy(upstream.server_address[:2])  # type: ignore[arg-type]
    with proxy:
        idle = connect(proxy)  # left open: the exit must close it
        idle.sendall(b"x\n")
        assert read_line(idle) == b"ok x\n"
        proxy.delay_response(30, times=1)  # a long hold is interrupted at exit
        held = connect(proxy)
        held.sendall(b"y\n")
        seen(lambda: proxy.fired["delay"] == 1)
        port = proxy.port
    leftover = [t for t in set(threading.enumerate()) - before if t.name.startswith("faultproxy")]
    assert leftover == []
    assert read_line(idle) == b"" and read_line(held) == b""
    idle.close()
    held.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1)
