"""One LISTEN connection per process for every agent waiting on the ledger.

The ledger NOTIFYs `opledger_settle` with an operation's id in the transaction that
settles it (for operations an agent waits on). A process may hold hundreds of agents
waiting at once, in threads and in event loops alike; each used to open a connection of
its own to LISTEN. Here one daemon thread per process and database holds the only
listening connection and wakes the waiters whose operations a notification names:

    waiter = listener_for(dsn).watch({op_id})   # listening before the first read
    ...read how it stands; while not at rest:
    waiter.wait(timeout)                        # or: await waiter.await_(timeout)
    waiter.close()

A waiter registers *before* its first read of the operation, and the thread is listening
before any waiter registers (`watch` waits for it), so no settle can fall between the read
and the wait. When the connection is lost, every waiter is woken to read again (what it
missed), and the thread reconnects with a growing pause; while it is down, waiters fall
back on their own polling interval. After a fork the child gets a listener of its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Iterable
from typing import Any

import psycopg

log = logging.getLogger("opledger.agents")

#: the channel the ledger NOTIFYs on (`opledger_notify_settle` in ledger/schema.sql)
CHANNEL = "opledger_settle"
#: how long `watch` waits for the listening connection before the waiter polls instead
CONNECT_WAIT = 5.0
#: the pause before reconnecting, doubling up to RECONNECT_MAX
RECONNECT_MIN, RECONNECT_MAX = 0.2, 5.0


class Waiter:
    """One agent's wait: the operations it watches, woken when a notification names one
    (or when the listener lost notifications and everyone must read again)."""

    def __init__(self, listener: Listener, ids: set[str]) -> None:
        self._listener = listener
        self.ids = set(ids)
        self._event = threading.Event()
        self._loops: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def watch(self, ids: Iterable[str]) -> None:
        """Watch `ids` too (the dependencies a pending operation turned out to wait on)."""
        self._listener._add(self, set(ids) - self.ids)

    def wake(self) -> None:
        self._event.set()
        for loop, event in list(self._loops):
            loop.call_soon_threadsafe(event.set)

    def wait(self, timeout: float) -> bool:
        """Block until woken or `timeout` seconds passed; True when woken. Clears the wake."""
        woken = self._event.wait(timeout)
        self._event.clear()
        return woken

    async def await_(self, timeout: float) -> bool:
        """`wait` for asyncio: the listener's thread wakes this task's loop."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        entry = (loop, event)
        self._loops.append(entry)
        try:
            if self._event.is_set():
                woken = True
            else:
                try:
                    await asyncio.wait_for(event.wait(), timeout)
                    woken = True
                except TimeoutError:
                    woken = False
        finally:
            self._loops.remove(entry)
        self._event.clear()
        return woken

    def close(self) -> None:
        self._listener._remove(self)

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Listener:
    """The listening connection of one process for one database, and its waiters."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._lock = threading.Lock()
        self._by_id: dict[str, set[Waiter]] = {}
        self._waiters: set[Waiter] = set()
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    def watch(self, ids: Iterable[str]) -> Waiter:
        """A waiter on `ids`, registered once the connection listens (up to CONNECT_WAIT
        seconds; past that it is registered all the same and relies on its own polling)."""
        self._start()
        waiter = Waiter(self, set())
        self._add(waiter, set(ids))
        if not self._listening.wait(CONNECT_WAIT):
            log.warning("not listening for settles yet; the waiter polls until it is")
        return waiter

    def waiting(self) -> int:
        with self._lock:
            return len(self._waiters)

    def stop(self) -> None:
        """Stop the thread and close the connection (tests; a process just exits)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _add(self, waiter: Waiter, ids: set[str]) -> None:
        with self._lock:
            self._waiters.add(waiter)
            waiter.ids |= ids
            for op_id in ids:
                self._by_id.setdefault(op_id, set()).add(waiter)

    def _remove(self, waiter: Waiter) -> None:
        with self._lock:
            self._waiters.discard(waiter)
            for op_id in waiter.ids:
                others = self._by_id.get(op_id)
                if others is not None:
                    others.discard(waiter)
                    if not others:
                        del self._by_id[op_id]

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(
                target=self._run, name="opledger-settle-listener", daemon=True
            )
            self._thread.start()

    def _wake_all(self) -> None:
        with self._lock:
            everyone = list(self._waiters)
        for waiter in everyone:
            waiter.wake()

    def _run(self) -> None:
        pause = RECONNECT_MIN
        while not self._stopped.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._listening.set()
                    self._wake_all()  # whatever settled while nobody listened: read again
                    pause = RECONNECT_MIN
                    self._pump(conn)
            except psycopg.Error as exc:
                if self._listening.is_set():
                    log.warning("the settle listener lost its connection (%s); reconnecting", exc)
            self._listening.clear()
            self._wake_all()
            if self._stopped.wait(pause):
                return
            pause = min(pause * 2, RECONNECT_MAX)

    def _pump(self, conn: psycopg.Connection[Any]) -> None:
        while not self._stopped.is_set():
            for notice in conn.notifies(timeout=1.0):
                with self._lock:
                    woken = list(self._by_id.get(notice.payload, ()))
                for waiter in woken:
                    waiter.wake()


_listeners: dict[tuple[int, str], Listener] = {}
_listeners_lock = threading.Lock()


def listener_for(dsn: str) -> Listener:
    """This process's listener for the database at `dsn` (a fresh one after a fork)."""
    key = (os.getpid(), dsn)
    with _listeners_lock:
        listener = _listeners.get(key)
        if listener is None:
            listener = _listeners[key] = Listener(dsn)
        return listener
