"""One body, two drivers: `run` in the calling thread and `arun` on an event loop take
the same steps in the same order, a sleep waits on the waiter's own form, and a step that
fails closes the body (its `with` and `finally` run) and reaches the caller unchanged."""

from __future__ import annotations

import asyncio
import threading

import pytest

from opledger.agents.blocking import Body, Call, Sleep, arun, run


class _Waiter:
    def __init__(self) -> None:
        self.slept: list[tuple[str, float]] = []

    def wait(self, timeout: float) -> bool:
        self.slept.append(("wait", timeout))
        return True

    async def await_(self, timeout: float) -> bool:
        self.slept.append(("await", timeout))
        return False


def _body(waiter: _Waiter, threads: list[str], closed: list[bool]) -> Body[tuple[int, bool]]:
    def read(n: int) -> int:
        threads.append(threading.current_thread().name)
        return n * 2

    try:
        n: int = yield Call(read, 21)
        woken: bool = yield Sleep(waiter, 0.5)
        return n, woken
    finally:
        closed.append(True)


def test_run_takes_each_step_in_the_calling_thread() -> None:
    waiter, threads, closed = _Waiter(), list[str](), list[bool]()
    assert run(_body(waiter, threads, closed)) == (42, True)
    assert threads == [threading.current_thread().name]
    assert waiter.slept == [("wait", 0.5)] and closed == [True]


def test_arun_takes_its_calls_in_a_worker_thread_and_sleeps_on_the_loop() -> None:
    waiter, threads, closed = _Waiter(), list[str](), list[bool]()
    assert asyncio.run(arun(_body(waiter, threads, closed))) == (42, False)
    assert threads and threads[0] != threading.current_thread().name
    assert waiter.slept == [("await", 0.5)] and closed == [True]


def _failing(closed: list[bool]) -> Body[int]:
    def boom() -> int:
        raise LookupError("the database is down")

    try:
        yield Call(boom)
        return 1
    finally:
        closed.append(True)


def test_a_failing_step_closes_the_body_and_raises_unchanged() -> None:
    closed: list[bool] = []
    with pytest.raises(LookupError, match="down"):
        run(_failing(closed))
    assert closed == [True]
    with pytest.raises(LookupError, match="down"):
        asyncio.run(arun(_failing(closed)))
    assert closed == [True, True]


def test_a_cancelled_wait_closes_the_body() -> None:
    closed: list[bool] = []

    class Forever(_Waiter):
        async def await_(self, timeout: float) -> bool:
            await asyncio.sleep(3600)
            return True

    def body() -> Body[None]:
        try:
            yield Sleep(Forever(), 3600)
        finally:
            closed.append(True)

    async def main() -> None:
        task = asyncio.create_task(arun(body()))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert closed == [True]
