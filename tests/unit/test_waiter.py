"""A waiter's asyncio wait: woken from another thread, timed out, or cancelled, and it
leaves nothing registered behind (no database: the listener's thread is not started)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from opledger.agents.listener import Listener, Waiter


def _waiter() -> Waiter:
    return Waiter(Listener("postgresql://unused"), {"op_1"}, None, None)


def test_woken_from_another_thread() -> None:
    waiter = _waiter()

    async def main() -> tuple[bool, float]:
        threading.Timer(0.05, waiter.wake, args=("answer",)).start()
        started = time.monotonic()
        woken = await waiter.await_(10)
        return woken, time.monotonic() - started

    woken, took = asyncio.run(main())
    assert woken and took < 5
    assert waiter.answer() == "answer" and waiter.answer() is None  # taken once
    assert waiter._loops == []


def test_times_out() -> None:
    waiter = _waiter()
    started = time.monotonic()
    assert asyncio.run(waiter.await_(0.05)) is False
    assert 0.04 <= time.monotonic() - started < 5
    assert waiter._loops == []


def test_a_wake_before_the_wait_is_not_lost() -> None:
    waiter = _waiter()
    waiter.wake()
    assert asyncio.run(waiter.await_(10)) is True


def test_cancelled_leaves_nothing_behind() -> None:
    waiter = _waiter()

    async def main() -> None:
        task = asyncio.create_task(waiter.await_(10))
        await asyncio.sleep(0.01)
        assert len(waiter._loops) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        waiter.wake()  # a late wake of a cancelled wait changes nothing
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert waiter._loops == []
