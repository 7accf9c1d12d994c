"""CPU time of processes and process groups (from /proc), and a drain timed beside it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from opledger.dev.processes import Proc, Stack, wait_until


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None if it is not visible."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cpu_of(fields: list[str]) -> float:
    """User + system CPU seconds from a process's stat fields."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far, or None if it is not visible."""
    fields = _stat(pid)
    return _cpu_of(fields) if fields is not None else None


def _group_cpu_s(pgid: int) -> tuple[float, float]:
    """CPU seconds of the live processes in process group `pgid`: its leader (the worker's
    main process, which consumes, acknowledges and sends events) and the rest (the pool's
    processes, which run the tasks)."""
    main = pool = 0.0
    for entry in Path("/proc").iterdir():
        fields = _stat(entry.name) if entry.name.isdigit() else None
        if fields is None or int(fields[2]) != pgid:
            continue
        if int(entry.name) == pgid:
            main += _cpu_of(fields)
        else:
            pool += _cpu_of(fields)
    return main, pool


@dataclass
class Drain:
    """One timed drain: seconds, and the CPU the worker processes spent during it."""

    seconds: float
    main_cpu_s: float  #: the worker's main process
    pool_cpu_s: float  #: the worker's pool processes (where the tasks run)
    broker_cpu_s: float | None

    @property
    def worker_cpu_s(self) -> float:
        return self.main_cpu_s + self.pool_cpu_s


def _drain(
    stack: Stack,
    name: str,
    module: str,
    argv: list[str],
    finished: Callable[[], float | None],
    redis_pid: int | None,
    before_kill: Callable[[], None] = lambda: None,
) -> Drain:
    """Start a worker on a full queue and wait until `finished()` returns the wall-clock
    time (`time.time()`) the last task ended at. Timed from the worker's 'ready'; the CPU
    of its processes (and of the broker) is read at 'ready' and once the drain is over, so
    start-up is excluded from both alike. `before_kill` runs while the worker still lives."""
    proc = Proc(name, argv, stack.env, stack.workdir / f"{name}.log", module=module)
    stack.workers[name] = proc
    wait_until(lambda: "ready." in proc.output(), 60, f"{name} to start", every=0.01)
    ready = time.time()
    cpu0 = _group_cpu_s(proc.proc.pid)
    broker0 = _cpu_s(redis_pid) if redis_pid else None
    ended = wait_until(finished, 600, f"{name} to drain", every=0.01)
    cpu1 = _group_cpu_s(proc.proc.pid)
    broker1 = _cpu_s(redis_pid) if redis_pid else None
    before_kill()
    stack.kill_worker(name)
    broker = broker1 - broker0 if broker0 is not None and broker1 is not None else None
    return Drain(
        seconds=float(ended) - ready,
        main_cpu_s=cpu1[0] - cpu0[0],
        pool_cpu_s=cpu1[1] - cpu0[1],
        broker_cpu_s=broker,
    )


def _worker_argv(concurrency: int) -> list[str]:
    return ["worker", "-c", str(concurrency), "--loglevel", "INFO"]
