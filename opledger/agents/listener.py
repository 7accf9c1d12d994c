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

A waiter may name the operation it answers for (`subject`) and how to read answers
(`read`: many operations in one statement, `Ledger.answers`). Then the thread reads the
answers of every waiter a batch of notifications woke, one statement per batch, before it
wakes them: a woken waiter finds its answer (`Waiter.answer`) and reads nothing itself. So
however many agents wait in a process, waiting costs it two connections: the listening one
and the one the thread reads on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import psycopg
from sqlalchemy.engine import URL

from opledger.ledger.connector import conninfo, dedicated, run
from opledger.ledger.queries.dedicated import LISTEN_SETTLES, SETTLE_CHANNEL

log = logging.getLogger("opledger.agents")

#: the channel the ledger NOTIFYs on (`opledger_notify_settle` in ledger/schema.sql)
CHANNEL = SETTLE_CHANNEL
#: how long `watch` waits for the listening connection before the waiter polls instead
CONNECT_WAIT = 5.0
#: the pause before reconnecting, doubling up to RECONNECT_MAX
RECONNECT_MIN, RECONNECT_MAX = 0.2, 5.0


#: reads how many operations stand in one statement: answers by id (`Ledger.answers`)
Read = Callable[[Iterable[str]], Mapping[str, Any]]


class Waiter:
    """One agent's wait: the operations it watches, woken when a notification names one
    (or when the listener lost notifications and everyone must read again)."""

    def __init__(
        self, listener: Listener, ids: set[str], subject: str | None, read: Read | None
    ) -> None:
        self._listener = listener
        self.ids = set(ids)
        #: the operation this waiter is answered for, and how the listener reads answers
        self.subject = subject
        self.read = read
        self._answer: Any = None
        #: whether every notification about `ids` reaches it: the connection was listening
        #: when it was registered (`Listener.watch`)
        self.heard = False
        self._event = threading.Event()
        self._loops: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[bool]]] = []

    def answer(self) -> Any:
        """The subject's answer the listener read when it last woke this waiter (once),
        or None: then read it yourself."""
        answer, self._answer = self._answer, None
        return answer

    def watch(self, ids: Iterable[str]) -> None:
        """Watch `ids` too (the dependencies a pending operation turned out to wait on)."""
        self._listener._add(self, set(ids) - self.ids)

    def wake(self, answer: Any = None) -> None:
        self._answer = answer
        self._event.set()
        for loop, woken in list(self._loops):
            loop.call_soon_threadsafe(_resolve, woken, True)

    def wait(self, timeout: float) -> bool:
        """Block until woken or `timeout` seconds passed; True when woken. Clears the wake."""
        woken = self._event.wait(timeout)
        self._event.clear()
        return woken

    async def await_(self, timeout: float) -> bool:
        """`wait` for asyncio: the listener's thread wakes this task's loop (a future of
        the loop's, resolved from that thread; the timeout resolves it otherwise)."""
        loop = asyncio.get_running_loop()
        woken = loop.create_future()
        entry = (loop, woken)
        self._loops.append(entry)
        timer = None
        try:
            if self._event.is_set():
                result = True
            else:
                timer = loop.call_later(timeout, _resolve, woken, False)
                result = await woken
        finally:
            if timer is not None:
                timer.cancel()
            self._loops.remove(entry)
        self._event.clear()
        return result

    def close(self) -> None:
        self._listener._remove(self)

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():  # woken and timed out at once, or cancelled: the first wins
        future.set_result(value)


class Listener:
    """The listening connection of one process for one database, and its waiters."""

    def __init__(self, dsn: str) -> None:
        #: the database, as `connector.dedicated` takes it (a URL in any spelling, or a
        #: libpq conninfo)
        self.dsn = dsn
        self._lock = threading.Lock()
        self._by_id: dict[str, set[Waiter]] = {}
        self._waiters: set[Waiter] = set()
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        #: a waiter may have read while nobody listened (a lost connection, a slow first
        #: one): the next connection wakes every waiter to read again
        self._unheard = False

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    def watch(
        self,
        ids: Iterable[str],
        *,
        subject: str | None = None,
        read: Read | None = None,
        then: Callable[[], object] | None = None,
    ) -> Waiter:
        """A waiter on `ids`, returned once the connection listens (up to CONNECT_WAIT
        seconds; past that all the same, and it relies on its own polling). With `subject`
        and `read`, the listener reads `subject`'s answer with `read` when a notification
        wakes the waiter (`Waiter.answer`). `then` runs once the waiter is registered,
        before any wait for the connection (an agent publishes its dispatch there).

        `Waiter.heard` says whether the connection was listening when the waiter was
        registered: if not, a settle may have come before it did, and only a read after
        `watch` returns can tell."""
        self._start()
        waiter = Waiter(self, set(), subject, read)
        self._add(waiter, set(ids))
        waiter.heard = self._listening.is_set()
        if then is not None:
            then()
        if not waiter.heard and not self._listening.wait(CONNECT_WAIT):
            self._unheard = True  # it reads before anyone listens: wake it once we do
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
                with dedicated(self.dsn, timeout=10) as conn:
                    run(conn, LISTEN_SETTLES)
                    self._listening.set()
                    if self._unheard:  # whatever settled while nobody listened: read again
                        self._unheard = False
                        self._wake_all()
                    pause = RECONNECT_MIN
                    self._pump(conn)
            except psycopg.Error as exc:
                if self._listening.is_set():
                    log.warning("the settle listener lost its connection (%s); reconnecting", exc)
            self._listening.clear()
            self._unheard = True
            self._wake_all()
            if self._stopped.wait(pause):
                return
            pause = min(pause * 2, RECONNECT_MAX)

    def _pump(self, conn: psycopg.Connection[Any]) -> None:
        while not self._stopped.is_set():
            # what one read of the socket brings (every notification already received),
            # then what arrived meanwhile: one batch, its answers read together
            batch = list(conn.notifies(timeout=1.0, stop_after=1))
            if batch:
                batch.extend(conn.notifies(timeout=0))
                self._deliver({notice.payload for notice in batch})

    def _deliver(self, ids: set[str]) -> None:
        """Wake the waiters watching any of `ids`, each with its subject's answer read
        first: one `read` per reader for the whole batch."""
        with self._lock:
            woken = {w for op_id in ids for w in self._by_id.get(op_id, ())}
        by_read: dict[Read, list[Waiter]] = {}
        for waiter in woken:
            if waiter.read is not None and waiter.subject is not None:
                by_read.setdefault(waiter.read, []).append(waiter)
            else:
                waiter.wake()
        for read, waiters in by_read.items():
            try:
                found = read({w.subject for w in waiters if w.subject is not None})
            except Exception as exc:  # the waiters read for themselves
                log.warning("could not read the answers of %d waiters: %s", len(waiters), exc)
                found = {}
            for waiter in waiters:
                waiter.wake(found.get(waiter.subject) if waiter.subject is not None else None)


_listeners: dict[tuple[int, str], Listener] = {}
_listeners_lock = threading.Lock()


def listener_for(dsn: str | URL) -> Listener:
    """This process's listener for the database at `dsn` (a URL in any spelling, or a
    libpq conninfo: `connector.conninfo`), a fresh one after a fork."""
    libpq = conninfo(dsn)
    key = (os.getpid(), libpq)
    with _listeners_lock:
        listener = _listeners.get(key)
        if listener is None:
            listener = _listeners[key] = Listener(libpq)
        return listener
