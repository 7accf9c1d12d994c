"""An agent process that sends its acts inline (`Effects(..., inline=...)`), for the inline
path's crash-window tests: `main([point, run])` asks for one act of each of the crash
tests' actions at once, one thread each, and with `point` a crash point
(`opledger.dev.crashpoints.NAMES`) SIGKILLs itself once every thread has reached it, so
each act is caught in the same window. Without one (`-`), it prints each answer as JSON and
exits 0. Its settings are the environment's (a system stack's)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from typing import Any

from opledger.adapters.registry import load_registry
from opledger.agents import EffectResult, Effects
from opledger.agents.inline import Inline
from opledger.dev.chaos.variants import KINDS
from opledger.dev.crashpoints import CrashPoints, worker_hooks
from opledger.ledger import Ledger
from opledger.settings import get_settings
from opledger.tasks.worker import WorkerConfig

#: the crash tests' actions: each contract kind of the sandbox's CRM, the email API, SMTP
ACTIONS = (*(kind.action for kind in KINDS), "email.send.v1", "email.smtp_send.v1")


class AllThere(CrashPoints):
    """Kills this process at `point` once each of `n` threads has reached it."""

    def __init__(self, point: str, n: int) -> None:
        super().__init__({point: 1})
        self.barrier = threading.Barrier(n)

    def reached(self, name: str) -> None:
        if name not in self.armed:
            return
        # a thread that took another path breaks the barrier: die all the same
        with contextlib.suppress(threading.BrokenBarrierError):
            self.barrier.wait(timeout=30)
        os.kill(os.getpid(), signal.SIGKILL)


def act(action: str, i: int) -> dict[str, Any]:
    if action.startswith("email."):
        return {
            "target": "owner@acme.test",
            "payload": {"to": "owner@acme.test", "subject": f"Case {i} closed", "text": "Done."},
        }
    return {"target": f"case-{i}", "payload": {"note": f"closed inline {i}"}}


def main(argv: list[str]) -> int:
    point, run = argv
    settings = get_settings()
    registry = load_registry(settings)
    ledger = Ledger.from_url(
        settings.require_database_url(), actions=registry, **settings.ledger_options()
    )
    hooks = None if point == "-" else worker_hooks(AllThere(point, len(ACTIONS)))
    # every act dispatches at once (the barrier waits for all of them)
    inline = Inline(
        registry,
        hooks=hooks,
        config=WorkerConfig.from_settings(settings),
        concurrency=len(ACTIONS),
    )
    effects = Effects(ledger, inline=inline)
    answers: dict[str, EffectResult] = {}

    def one(i: int, action: str) -> None:
        answers[action] = effects.effect(
            tenant="acme",
            run=run,
            action=action,
            authorization_ref="auth_acme",
            wait=10,
            **act(action, i),
        )

    threads = [threading.Thread(target=one, args=(i, a)) for i, a in enumerate(ACTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for action, answer in sorted(answers.items()):
        print(json.dumps({"action": action, "kind": answer.kind, "path": answer.path}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
