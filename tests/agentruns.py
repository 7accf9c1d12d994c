"""Runs of an example agent (`opledger.examples.*`) in the system tests, each a process of
its own, started, SIGKILLed and waited for — forked from one process that imported the
example once (LangGraph, Pydantic AI or the Agents SDK, and opledger: most of an agent
process's CPU) and did nothing more."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Imports the example module it is given once, then forks one process per command line it
#: reads: the child runs the example's `main` with it, its output in files, and exits as
#: the script would. It answers with the child's pid, then reads what to do — "wait" for
#: it, or "kill" it with SIGKILL now — and answers with its exit code once it reaped it
#: (so the pid is the run's until then).
FORK_SERVER = r"""
import importlib, json, os, signal, sys

example = importlib.import_module(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    argv, out, err = json.loads(line)
    pid = os.fork()
    if pid == 0:
        sys.stdin = open(os.devnull)
        os.dup2(sys.stdin.fileno(), 0)
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = [example.__file__, *argv]
        sys.exit(example.main(argv))
    print(pid, flush=True)
    if sys.stdin.readline() == "kill\n":
        os.kill(pid, signal.SIGKILL)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


class Agents:
    """Runs of the example agent `module` (forked from `FORK_SERVER`, which paid for the
    imports once): started, killed with SIGKILL, waited for."""

    def __init__(self, module: str, env: dict[str, str], workdir: Path) -> None:
        self.workdir = workdir
        self.server = subprocess.Popen(
            [sys.executable, "-c", FORK_SERVER, module],
            env=env,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,  # its runs are in its group: reaped with it
        )
        self._buffer = b""
        self.runs = 0
        assert self.line(120) == "ready"

    def line(self, timeout: float) -> str:
        assert self.server.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self.server.stdout], [], [], deadline - time.monotonic())
            chunk = os.read(self.server.stdout.fileno(), 4096) if ready else b""
            if not chunk:
                raise AssertionError(
                    f"the agents' fork server: no answer (exit {self.server.poll()})"
                )
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def start(self, *args: str) -> Run:
        """A run of the example with this command line, started."""
        self.runs += 1
        out, err = (self.workdir / f"agent-{self.runs}.{name}" for name in ("out", "err"))
        self.tell(json.dumps([list(args), str(out), str(err)]))
        return Run(self, int(self.line(30)), out, err)

    def tell(self, line: str) -> None:
        assert self.server.stdin is not None
        self.server.stdin.write(f"{line}\n".encode())

    def stop(self) -> None:
        assert self.server.stdin is not None
        self.server.stdin.close()  # it ends when its input does
        try:
            self.server.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()
        finally:
            assert self.server.stdout is not None
            self.server.stdout.close()


class Run:
    """One run of the example agent: a live process (or one that exited and is not reaped
    yet) until `wait` or `kill` returns."""

    def __init__(self, agents: Agents, pid: int, out: Path, err: Path) -> None:
        self.agents, self.pid, self.out, self.err = agents, pid, out, err

    def wait(self, timeout: float = 90) -> int:
        """Its exit code, once it ended."""
        self.agents.tell("wait")
        try:
            return int(self.agents.line(timeout))
        except AssertionError:
            os.kill(self.pid, signal.SIGKILL)  # not reaped: still this run's pid
            self.agents.line(30)  # its exit code: the next run's answers come next
            raise

    def kill(self) -> None:
        """SIGKILL it now (it must still be running)."""
        self.agents.tell("kill")
        code = int(self.agents.line(30))
        assert code == -signal.SIGKILL, f"the run ended (exit {code}) before it was killed"
