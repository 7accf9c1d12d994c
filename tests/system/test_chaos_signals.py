"""`opledger chaos` stopped by SIGTERM leaves nothing behind: no process, no directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opledger.dev.processes import wait_until

pytestmark = [pytest.mark.system, pytest.mark.own_processes]


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every process, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] == "Z":  # a zombie is dead; it only waits to be reaped
            continue
        found[int(entry.name)] = (int(fields[1]), fields[19])
    return found


def _descendants(root: int) -> set[tuple[int, str]]:
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add((child, procs[child][1]))
            todo.append(child)
    return found


@pytest.mark.timeout(240)
def test_sigterm_stops_every_process_and_removes_the_temporary_directory(
    own_env: dict[str, str], tmp_path: Path
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(own_env)
    chaos = subprocess.Popen(
        [sys.executable, "-m", "opledger.cli", "chaos", "--ops", "100", "--chaos-seconds", "60"],
        env={**env, "TMPDIR": str(tmp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Running: its Redis, providers, two workers (with their pool processes), a beat.
        wait_until(lambda: len(_descendants(chaos.pid)) >= 6, 90, "the chaos stack to start")
        seen: set[tuple[int, str]] = set()
        until = time.monotonic() + 3
        while time.monotonic() < until:  # a few seconds in: operations are moving
            seen |= _descendants(chaos.pid)
            time.sleep(0.2)
        assert list(tmp.iterdir()), "the run made no temporary directory"
        chaos.send_signal(signal.SIGTERM)
        _, stderr = chaos.communicate(timeout=120)
    finally:
        if chaos.poll() is None:
            chaos.kill()
            chaos.communicate()
    assert chaos.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "SIGTERM" in stderr
    alive = _processes()
    left = [pid for pid, started in seen if alive.get(pid, (0, ""))[1] == started]
    assert left == [], [Path(f"/proc/{pid}/cmdline").read_text() for pid in left]
    assert list(tmp.iterdir()) == []
    assert os.getpid() in alive
