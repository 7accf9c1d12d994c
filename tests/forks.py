"""The suite's forked `opledger` processes (`opledger.dev.forks`): the system stacks'
workers and beat (`Stack(..., proc=ForkedProc)`), the console's tests' consoles, the
commands `tests.consoles.opledger_forked` runs. Each forked process is written down with
this pytest process's reaper (`tests.reaper`): killed with its group if the session dies
first."""

from __future__ import annotations

from opledger.dev.forks import ForkedProc, ForkServer, fork_server, watch_forks
from tests import reaper


def _reaped(pid: int) -> None:
    watcher = reaper.installed()
    if watcher is not None:
        watcher.watch(pid, group=True)


watch_forks(_reaped)

__all__ = ["ForkServer", "ForkedProc", "fork_server"]
