"""Agents in threads and on an event loop, in a process whose tasks module only its main
thread imported: each causes one effect and waits for it. Prints one JSON line: for each
agent, the result's kind and how long it waited.

    python tests/system/threaded_agent.py RUN THREADS COROUTINES WAIT_S

Needs the stack's environment (database, broker, providers: `stack_env`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any

from opledger.agents import Effects
from opledger.tasks.app import runtime  # imported here, on the main thread, only

GRANT = "auth_agent"


def main(argv: list[str]) -> int:
    run, threads, coroutines, wait = argv[0], int(argv[1]), int(argv[2]), float(argv[3])
    effects = Effects(runtime().ledger)
    results: dict[str, tuple[str, float]] = {}

    def ask(name: str) -> dict[str, Any]:
        return {
            "tenant": "acme",
            "run": run,
            "action": "crm.update_case.v1",
            "target": f"case-{name}",
            "payload": {"fields": {"priority": "high"}},
            "authorization_ref": GRANT,
            "asked_by": name,
            "wait": wait,
        }

    def agent(name: str) -> None:
        started = time.monotonic()
        result = effects.effect(**ask(name))
        results[name] = (result.kind, time.monotonic() - started)

    async def loop_agents() -> None:
        async def one(name: str) -> None:
            started = time.monotonic()
            result = await effects.aeffect(**ask(name))
            results[name] = (result.kind, time.monotonic() - started)

        await asyncio.gather(*(one(f"coroutine-{i}") for i in range(coroutines)))

    workers = [threading.Thread(target=agent, args=(f"thread-{i}",)) for i in range(threads)]
    workers.append(threading.Thread(target=asyncio.run, args=(loop_agents(),)))
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(json.dumps(results, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
