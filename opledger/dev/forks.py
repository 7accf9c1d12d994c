"""`opledger` processes forked from a server that imported the command once.

Starting `opledger worker` costs a process about 2.7 CPU-s, half of it importing the
command, Celery and the adapters; a chaos run kills workers and starts them again every
few seconds, and the test suite starts about a hundred. A fork of a process that has
imported them all is a real process all the same — its own pid, session, environment,
directory and standard streams, SIGKILLed like any other — without paying for the imports
again. Development tooling only: `opledger chaos` and `opledger bench` start their
workers and beat this way (`Stack(..., proc=ForkedProc)`); a production worker is started
by whatever runs it, as ever.

`ForkServer` is that process: it imports the command and the modules its commands import
once they run (as `python -m opledger.cli` would, reading no setting: checked; an extra
that is not installed is left to the command), then serves JSON requests, one a line on
stdin, each answered with one line that repeats its "id": "start" forks a child that
leads a session of its own and takes the request's directory, environment and standard
streams (files), then runs the command as `python -m opledger.cli` does, so its exit
status and output are a real process's; "wait" reaps its children until that one has
exited (its exit code) or the time is up (null). At EOF — this process exited, however
it exited — it kills those left.

`ForkedProc` is `opledger.dev.processes.Proc` started that way.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from opledger.ledger.pgschema import SCHEMA_VARIABLE

from .processes import Proc, Process

_SERVER = r"""
import gc, importlib, json, os, signal, sys, time

import opledger.cli.main
from opledger.settings import get_settings

for module in json.loads(sys.argv[1]):
    try:
        importlib.import_module(module)
    except ImportError:  # an extra that is not installed: its commands import it themselves
        pass
if get_settings.cache_info().currsize:
    sys.exit("importing the command read the settings: its forks would share them")
sys.stdout.flush()
sys.stderr.flush()
codes, live, mine = {}, set(), None


def reap():
    while live:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if not pid:
            return
        live.discard(pid)
        codes[pid] = os.waitstatus_to_exitcode(status)


def answer(reply):
    reply["id"] = request["id"]
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    request = json.loads(line)
    if request["op"] == "start":
        gc.freeze()  # what the parent made stays shared with the child: no collection walks it
        pid = os.fork()
        if pid == 0:
            mine = request
            break
        live.add(pid)
        answer({"pid": pid})
    else:  # wait
        pid, deadline = request["pid"], time.monotonic() + request["timeout"]
        while True:
            reap()
            if pid in codes or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        answer({"code": codes.pop(pid, None)})
if mine is None:  # the tests are over
    for pid in live:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    sys.exit(0)

os.setsid()  # a session of its own: a signal to its group reaches it and its children only
os.chdir(mine["cwd"])
os.environ.clear()
os.environ.update(mine["env"])
for fd, path, flags in (
    (0, mine["stdin"], os.O_RDONLY),
    (1, mine["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND),
    (2, mine["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND),
):
    opened = os.open(path, flags, 0o600)
    os.dup2(opened, fd)
    os.close(opened)
sys.stdin = open(0, closefd=False)  # not the server's requests, read ahead or not
sys.argv = ["opledger", *mine["args"]]
del codes, live, mine, line, request, pid
import runpy

runpy.run_module("opledger.cli", run_name="__main__", alter_sys=True)
"""

#: what commands import once they run, imported by the fork server too (none of them reads
#: a setting as it is imported: checked): the start-up checks (worker, beat, check), the
#: adapters, Celery's worker, pool and beat with both brokers' transports, then
#: `opledger console` and `opledger operator`
PRELOAD = (
    "opledger.cli.checks",
    "opledger.adapters.crm",
    "opledger.adapters.imap",
    "opledger.adapters.smtp",
    "opledger.adapters.stripe",
    "opledger.adapters.webhook",
    "opledger.dev.chaos.variants",
    "opledger.tasks.app",
    "opledger.tasks.beat",
    "celery.apps.worker",
    "celery.apps.beat",
    "celery.beat",
    "celery.worker.consumer",
    "celery.concurrency.prefork",
    "billiard.pool",
    "httpx",
    "kombu.connection",
    "kombu.transport.redis",
    "kombu.transport.pyamqp",
    "redis",
    "alembic.script",
    "opledger.console.accounts",
    "opledger.console.app",
    "uvicorn",
)


class ForkServer:
    """A `_SERVER` process for one environment (that of the commands' imports): started
    once, then each `opledger` process is a fork of it. Stopped when this process exits."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._lock = threading.Lock()
        self._asked = 0
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, json.dumps(PRELOAD)],
            cwd=tempfile.gettempdir(),
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        atexit.register(self.close)

    def _ask(self, request: Mapping[str, object]) -> dict[str, int | None]:
        """The server's answer to `request`. Each request carries a number the answer
        repeats: an ask cut short after its request was written (a signal's handler raised
        in this thread: `opledger chaos` stopped by SIGTERM) leaves its answer unread, and
        the next ask passes over it instead of taking it for its own (and kills the
        process a "start" so cut short forked: nobody else knows of it)."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            self._asked += 1
            self._proc.stdin.write(json.dumps({**request, "id": self._asked}) + "\n")
            self._proc.stdin.flush()
            while True:
                line = self._proc.stdout.readline()
                assert line, f"the fork server exited ({self._proc.poll()})"
                reply: dict[str, int | None] = json.loads(line)
                if reply.pop("id") == self._asked:
                    return reply
                orphan = reply.get("pid")
                if orphan is not None:  # forked for an ask that never learned of it: nobody's
                    with contextlib.suppress(OSError):
                        os.killpg(orphan, signal.SIGKILL)

    def start(
        self,
        args: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        stdin: Path,
        out: Path,
        err: Path,
    ) -> int:
        """Fork `opledger ARGS` (stdout and stderr appended to `out` and `err`), leading a
        session of its own: its pid."""
        request = {
            "op": "start",
            "args": list(args),
            "env": dict(env),
            "cwd": str(cwd),
            "stdin": str(stdin),
            "stdout": str(out),
            "stderr": str(err),
        }
        pid = self._ask(request)["pid"]
        assert pid is not None
        for watch in _watchers:
            watch(pid)
        return pid

    def wait(self, pid: int, timeout: float) -> int | None:
        """The exit code of `pid`, once it has exited; None if it runs on after `timeout`.
        (Told once: the server forgets it then.)"""
        return self._ask({"op": "wait", "pid": pid, "timeout": timeout})["code"]

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # EOF: it kills what is left and exits
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()


_servers: dict[tuple[tuple[str, str], ...], ForkServer] = {}

#: called with each forked child's pid (`watch_forks`)
_watchers: list[Callable[[int], None]] = []


def watch_forks(watch: Callable[[int], None]) -> None:
    """Have `watch` called with the pid of every process forked from now on (the test
    suite writes each down with its reaper)."""
    _watchers.append(watch)


def fork_server(env: Mapping[str, str]) -> ForkServer:
    """The fork server for commands run with `env`: one per environment less its OPLEDGER_
    settings (but the ledger's schema), which is what importing the command may read (a
    terminal's width: COLUMNS; the metrics' directory); each fork then takes `env` whole."""
    base = {k: v for k, v in env.items() if not k.startswith("OPLEDGER_") or k == SCHEMA_VARIABLE}
    key = tuple(sorted(base.items()))
    server = _servers.get(key)
    if server is None:
        server = _servers[key] = ForkServer(base)
    return server


class Forked:
    """A forked process as `Proc` keeps one (`opledger.dev.processes.Process`): its pid,
    `poll` and `wait`, asked of the server that forked it."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.wait(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server.wait(self.pid, 3600 if timeout is None else timeout)
        if self.returncode is None:
            assert timeout is not None
            raise subprocess.TimeoutExpired(["opledger"], timeout)
        return self.returncode


class ForkedProc(Proc):
    """`Proc` for an `opledger` command, forked from the `fork_server` of its environment
    instead of started with `python -m opledger.cli`: a process of its own all the same (its
    own session, directory, environment, log), without a second or two of imports. Other
    modules (`python -m opledger.dev.sandbox`) start as `Proc` starts them."""

    def _start(self, argv: list[str], env: dict[str, str], module: str) -> Process:
        if module != "opledger.cli":
            return super()._start(argv, env, module)
        server = fork_server(env)
        cwd = Path(env.get("OPLEDGER_STATE_DIR", os.getcwd()))
        pid = server.start(argv, env, cwd, Path(os.devnull), self.log, self.log)
        return Forked(server, pid)
