"""The suite's processes end with it however it ends (`tests.reaper`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: a "pytest process": installs the reaper, starts a child leading a group of its own with
#: a grandchild in it, and a plain child; prints their pids and waits to be killed
SESSION = """
import subprocess, sys, time
from tests import reaper
reaper.install()
group = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; wait"], start_new_session=True,
                         stdout=subprocess.PIPE, text=True)
grandchild = group.stdout.readline().strip()
plain = subprocess.Popen(["sleep", "300"])
print(group.pid, grandchild, plain.pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_session_killed_leaves_no_process_behind(sig: signal.Signals) -> None:
    root = Path(__file__).resolve().parents[2]
    with subprocess.Popen(
        [sys.executable, "-c", SESSION], cwd=root, stdout=subprocess.PIPE, text=True
    ) as session:
        assert session.stdout is not None
        pids = [int(p) for p in session.stdout.readline().split()]
        assert len(pids) == 3 and all(_alive(p) for p in pids)
        os.kill(session.pid, sig)
        session.wait(10)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if _alive(p)] == []
