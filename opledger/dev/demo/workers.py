"""The demo's workers: started ahead, in the background, each on a standby queue, and
switched onto the work queues when their scenario comes."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import ClassVar

from opledger.dev.forks import ForkedProc
from opledger.dev.processes import Proc, wait_until
from opledger.queues import QUEUES

OWNER = "owner@acme.test"
CASE = "case-318"
KILLED = "exited with 'signal 9 (SIGKILL)'"
#: where a worker waits before its scenario (a queue of its own: `<this>.<name>`); only
#: the sweeps that warm it up are sent there
STANDBY_QUEUE = "opledger-demo.standby"
#: the queues a scenario's worker is switched onto. The agent's clean worker keeps the
#: maintenance queue (sweep, relay) throughout, so an armed worker runs only the tasks its
#: crash point is about.
SWITCHED = ("dispatch", "reconcile")
#: how often the demo looks at the ledger while it waits
POLL_S = 0.1


class Workers:
    """The demo's Celery workers: real `opledger worker` processes (prefork, two processes
    each), started ahead of their scenario and switched onto opledger's queues (and off)
    with Celery's remote control. Starting a worker takes seconds of CPU; the switch takes
    milliseconds, and shows in the worker's own log, where the demo waits for it."""

    #: what Celery logs when it starts (stops) consuming a queue
    MARKS: ClassVar[dict[str, str]] = {
        "add_consumer": "Started consuming from {}\n",
        "cancel_consumer": "Canceling queue {}\n",
    }

    def __init__(self, env: dict[str, str], workdir: Path, run: str) -> None:
        self.env = env
        self.workdir = workdir
        self.run = run
        self.procs: dict[str, Proc] = {}
        self.consuming: dict[str, set[str]] = {}
        self.planned: list[tuple[str, dict[str, str]]] = []
        self._ready: set[str] = set()
        self._warmed: set[str] = set()
        self.background: set[str] = set()  #: started ahead, at a lower CPU priority

    def hostname(self, name: str) -> str:
        return f"{name}@demo-{self.run}"

    def spawn(self, name: str, env: dict[str, str] | None = None, *, active: bool = False) -> Proc:
        """Start `name` with `env` added; unless `active`, on the standby queue only."""
        argv = ["worker", "-c", "2", "--hostname", self.hostname(name), "--loglevel", "INFO"]
        if not active:
            argv += ["--queues", self.standby(name)]
        if name in self.procs:
            self.kill(name)
        # forked from one process that imported the worker (`dev.forks`): a crashed
        # worker's successor is up in a fraction of a start-up's CPU
        proc = ForkedProc(
            name, argv, {**self.env, **(env or {})}, self.workdir / f"worker-{name}.log"
        )
        self.procs[name] = proc
        self.consuming[name] = set(QUEUES) if active else {self.standby(name)}
        return proc

    def standby(self, name: str) -> str:
        return f"{STANDBY_QUEUE}.{name}"

    def warm(self, name: str, sweeps: int = 2) -> None:
        """Send sweeps to `name`'s standby queue: its pool processes load the runtime (the
        ledger, the adapters: about a second of CPU each, at their first task) before its
        scenario, not in the middle of it. A sweep does what beat has every worker do."""
        from opledger.tasks.app import sweep

        for _ in range(sweeps):
            sweep.apply_async(queue=self.standby(name))

    def plan(self, name: str, **env: str) -> None:
        """Start `name` (on standby) in the background, one after the other."""
        self.planned.append((name, env))

    def pump(self) -> None:
        """Warm up the background workers that became ready; start the next planned one
        once none is starting. It runs at a lower CPU priority (nice 10) until it is
        needed, so it takes only the CPU the scenario in progress leaves: a start costs
        seconds of CPU, and there may be only two cores."""
        for name in self.background - self._warmed:
            if self.ready(name):
                self._warmed.add(name)
                self.warm(name)
        if not self.planned or any(not self.ready(name) for name in self.background):
            return
        name, env = self.planned.pop(0)
        proc = self.spawn(name, env)
        self.background.add(name)
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, proc.proc.pid, 10)  # its pool processes inherit it

    def _foreground(self, name: str) -> None:
        """Back to normal priority, once needed (allowed to root only: else it stays nice)."""
        if name in self.background:
            self.background.discard(name)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PGRP, self.procs[name].proc.pid, 0)

    def ready(self, name: str) -> bool:
        if name in self._ready:
            return True
        proc = self.procs[name]
        if proc.proc.poll() is not None:
            raise AssertionError(f"worker {name} died:\n{proc.output()[-3000:]}")
        if "ready." in proc.output():
            self._ready.add(name)
            return True
        return False

    def wait_ready(self, name: str, timeout: float = 90.0) -> None:
        for i, (planned, env) in enumerate(self.planned):
            if planned == name:  # needed now: start it even if another one is starting
                del self.planned[i]
                self.spawn(name, env)
                break
        self._foreground(name)

        def ready() -> bool:
            self.pump()
            return self.ready(name)

        wait_until(ready, timeout, f"worker {name} to be ready", every=POLL_S)

    def activate(self, name: str, queues: tuple[str, ...] = SWITCHED) -> None:
        """Make `name` consume `queues`; returns once it does."""
        self.wait_ready(name)
        self._switch(name, "add_consumer", [q for q in queues if q not in self.consuming[name]])
        self.consuming[name] |= set(queues)
        if self.standby(name) in self.consuming[name]:
            # It waits on its standby queue (Redis BRPOP, up to a second) before it looks
            # at the queues just added: a sweep there ends that wait.
            self.warm(name, 1)

    def deactivate(self, name: str, queues: tuple[str, ...] = SWITCHED) -> None:
        """Make `name` stop consuming `queues`; returns once it stopped."""
        self._switch(name, "cancel_consumer", [q for q in queues if q in self.consuming[name]])
        self.consuming[name] -= set(queues)

    def _switch(self, name: str, command: str, queues: list[str]) -> None:
        """Send `command` for each queue until the worker's log shows it done (a worker
        reconnecting after a Redis restart misses what is sent meanwhile)."""
        from opledger.tasks.app import app

        proc, host = self.procs[name], self.hostname(name)
        marks = [self.MARKS[command].format(queue) for queue in queues]
        before = [proc.output().count(mark) for mark in marks]
        errors: list[str] = []
        sent = -1.0

        def switched() -> bool:
            nonlocal sent
            if proc.proc.poll() is not None:
                raise AssertionError(f"worker {name} died:\n{proc.output()[-3000:]}")
            output = proc.output()
            if all(output.count(m) > n for m, n in zip(marks, before, strict=True)):
                return True
            if time.monotonic() - sent > 2.0:
                sent = time.monotonic()
                try:
                    for queue in queues:
                        getattr(app.control, command)(queue, destination=[host])
                except Exception as exc:  # the broker restarting: send again
                    errors.append(repr(exc))
            return False

        try:
            wait_until(switched, 30, f"worker {name}: {command} {queues}", every=POLL_S / 2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; errors while sending: {errors[-3:]}") from None

    def wait_idle(self, name: str) -> None:
        """Until `name` runs no task and holds none. (kombu 5.7: a worker holding an
        unacknowledged message when Redis restarts may die of an AttributeError while it
        gives the message back.)"""
        from opledger.tasks.app import app

        host = self.hostname(name)
        errors: list[str] = []

        def idle() -> bool:
            inspect = app.control.inspect(destination=[host], timeout=1.0)
            try:
                active, reserved = inspect.active() or {}, inspect.reserved() or {}
            except Exception as exc:  # a connection to a Redis restarted since: again
                errors.append(repr(exc))
                return False
            return host in active and not active[host] and not reserved.get(host)

        try:
            wait_until(idle, 20, f"worker {name} to finish its tasks", every=POLL_S)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; errors while asking: {errors[-3:]}") from None

    def kill(self, name: str) -> None:
        self.procs.pop(name).kill()
        self._ready.discard(name)
        self.background.discard(name)

    def crashes(self, name: str) -> int:
        return self.procs[name].output().count(KILLED)

    def stop_all(self) -> None:
        self.planned.clear()
        for proc in self.procs.values():
            proc.kill()
        self.procs.clear()
