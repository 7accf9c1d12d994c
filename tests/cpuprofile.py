"""Where the suite's CPU goes: `OPLEDGER_TEST_CPU=FILE pytest ...` appends one line per test
to FILE: its node id, its wall seconds and the CPU seconds its process tree used (this
pytest process, the children it reaped, and every process still alive that it started or
that is in a process group it started: workers and their pools, beats, providers). The
machine's Postgres, and daemons started outside `subprocess.Popen`, are not counted.

The suite is CPU-bound on two cores, so this, not the wall time of a test, says what a
test costs everyone else. `python -m tests.cpuprofile FILE` sums it per file."""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Iterator

import pytest

from tests import reaper

_TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu() -> float:
    """CPU seconds of this process, its reaped children, and its live tracked processes."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    tracked = reaper.installed()
    if tracked is None:
        return total
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # fields (after the name): state ppid pgrp ... utime(11) stime(12) cutime(13) cstime(14)
        pid, ppid, pgrp = int(entry), int(fields[1]), int(fields[2])
        if ppid == os.getpid():
            continue  # our own children: counted once reaped (RUSAGE_CHILDREN), else below
        if pid in tracked.children or pgrp in tracked.groups:
            total += sum(int(x) for x in fields[11:15]) / _TICK
    for pid in tracked.children:  # our live children themselves
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != b"Z":
            total += sum(int(x) for x in fields[11:15]) / _TICK
    return total


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    path = os.environ.get("OPLEDGER_TEST_CPU")
    if not path:
        return (yield)
    cpu, wall = _tree_cpu(), time.monotonic()
    try:
        return (yield)
    finally:
        line = f"{item.nodeid}\t{time.monotonic() - wall:.2f}\t{_tree_cpu() - cpu:.2f}\n"
        with open(path, "a") as f:
            f.write(line)


def main(path: str) -> None:
    cpu: dict[str, float] = {}
    wall: dict[str, float] = {}
    with open(path) as f:
        for line in f:
            nodeid, w, c = line.rstrip("\n").split("\t")
            name = nodeid.split("::")[0]
            cpu[name] = cpu.get(name, 0.0) + float(c)
            wall[name] = wall.get(name, 0.0) + float(w)
    print(f"total: {sum(cpu.values()):.0f} CPU s, {sum(wall.values()):.0f} s of tests")
    for name, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])[:40]:
        print(f"{seconds:8.1f} CPU s {wall[name]:8.1f} s  {name}")


if __name__ == "__main__":
    main(sys.argv[1])
