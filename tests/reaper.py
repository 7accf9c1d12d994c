"""Every process a test session starts ends with it, however the session ends.

A session ended by SIGTERM (a CI or a shell timeout), SIGKILL or a crash runs no fixture
finalizer: the workers, beats, Redis servers and providers it started would run on for
hours. So each pytest process starts one reaper: a small process in a session of its own
that holds the read end of a pipe whose write end only the pytest process keeps. Every
child the pytest process starts (`subprocess.Popen`, which the system harness, the
providers and the mail servers all use) is written down in that pipe; when the pytest
process dies, however it dies, the kernel closes the pipe and the reaper SIGKILLs each
child still alive, with its whole process group when the child leads its own (a Celery
worker and its pool, a shell and what it started). A child is recognised by its pid and
its start time, so a pid the system reused for another process is never killed.

A session that ends normally stops its processes itself; the reaper then finds them gone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

#: the reaper's program: read "pid start group" lines until EOF, then kill what is left
_PROGRAM = r"""
import os, signal, sys

def started(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None

children = []
for line in sys.stdin:
    pid, start, group = line.split()
    children.append((int(pid), start, group == "1"))
for pid, start, group in children:
    if started(pid) != start:
        continue  # gone, or its pid is someone else's now
    try:
        if group and os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
"""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


class Reaper:
    """The reaper of this process's children (`install` starts it)."""

    def __init__(self) -> None:
        read, self._write = os.pipe()
        os.set_inheritable(self._write, False)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _PROGRAM],
            stdin=read,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a signal to this process's group never reaches it
        )
        os.close(read)
        self._pid = os.getpid()
        #: the children written down, and those of them that lead a group of their own
        self.children: set[int] = set()
        self.groups: set[int] = set()

    def watch(self, pid: int, *, group: bool) -> None:
        if os.getpid() != self._pid:
            return  # a forked child's children are its own business
        start = _start_time(pid)
        if start is not None:
            os.write(self._write, f"{pid} {start} {int(group)}\n".encode())
            self.children.add(pid)
            if group:
                self.groups.add(pid)

    @property
    def pid(self) -> int:
        return self._proc.pid


_installed: Reaper | None = None


def installed() -> Reaper | None:
    """This process's reaper, if `install` started one."""
    return _installed


def install() -> Reaper | None:
    """Start this process's reaper and have every `subprocess.Popen` child written down.
    Without /proc (not Linux) there are no start times to tell a reused pid by: no reaper."""
    global _installed
    if _installed is not None or not os.path.isdir("/proc"):
        return _installed
    reaper = _installed = Reaper()
    original = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def execute_child(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)  # returns once the child has exec'd
        try:  # a child that leads a group of its own is killed with its group
            group = os.getpgid(self.pid) == self.pid
        except ProcessLookupError:
            return
        reaper.watch(self.pid, group=group)

    subprocess.Popen._execute_child = execute_child  # type: ignore[attr-defined]
    return reaper
