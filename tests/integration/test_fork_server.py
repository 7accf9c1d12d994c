"""The fork server's answers stay paired with their requests when an ask is cut short."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from opledger.dev.processes import wait_until
from tests.forks import ForkServer


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


class _Cut(BaseException):
    """What a signal's handler raises in the thread that was asking."""


@pytest.mark.timeout(60)
def test_an_ask_cut_short_leaves_the_next_one_its_own_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ForkServer({"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    try:
        stdout = server._proc.stdout
        assert stdout is not None
        readline = stdout.readline
        calls = 0

        def cut_once() -> str:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise _Cut  # the request is written, its answer is left unread
            return readline()

        monkeypatch.setattr(stdout, "readline", cut_once)
        log = tmp_path / "out.log"
        with pytest.raises(_Cut):
            server.start(
                ["--version"], {"PATH": os.environ["PATH"]}, tmp_path, Path(os.devnull), log, log
            )
        monkeypatch.setattr(stdout, "readline", readline)
        # The cut-short "start" forked a child all the same: this ask is answered about
        # the pid it names (its own answer, not the start's `{"pid": ...}` left unread),
        # and that child, which nobody would stop, is killed.
        wait_until(lambda: _children(server._proc.pid), 30, "the cut-short start's fork")
        orphan = _children(server._proc.pid)
        assert len(orphan) == 1
        assert server.wait(sys.maxsize // 2, 0) is None
        assert server.wait(orphan[0], 30) == -signal.SIGKILL
        started = server.start(
            ["--version"], {"PATH": os.environ["PATH"]}, tmp_path, Path(os.devnull), log, log
        )
        assert server.wait(started, 30) == 0
    finally:
        server.close()
