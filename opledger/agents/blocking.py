"""One body for a blocking call and its asyncio twin.

The logic of `Effects.effect` and of a wait on an operation is written once, as a
generator that yields each step that blocks (a statement, a publish, a sleep until the
listener wakes it) and is sent what the step returned. `run` drives it in the calling
thread; `arun` drives it on an event loop, each statement in a worker thread and each
sleep on the loop itself, so the loop is never blocked:

    def _body(self) -> Body[int]:
        n: int = yield Call(read, 1)
        yield Sleep(waiter, 1.0)
        return n

    run(self._body())            # the synchronous API
    await arun(self._body())     # the asyncio one

A step that raises closes the body (its `with` and `finally` blocks run) and the error
reaches the caller unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Wakeable(Protocol):
    """What a body sleeps on (`listener.Waiter`): a wake, or the time running out."""

    def wait(self, timeout: float) -> bool: ...

    async def await_(self, timeout: float) -> bool: ...


class Call:
    """A blocking call, `fn(*args)`: in the caller's thread, or in a worker thread under
    asyncio."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args

    def run(self) -> Any:
        return self.fn(*self.args)

    async def arun(self) -> Any:
        return await asyncio.to_thread(self.fn, *self.args)


@dataclass(frozen=True)
class Sleep:
    """Sleep until `waiter` is woken or `timeout` seconds passed (True when woken)."""

    waiter: Wakeable
    timeout: float

    def run(self) -> bool:
        return self.waiter.wait(self.timeout)

    async def arun(self) -> bool:
        return await self.waiter.await_(self.timeout)


Step = Call | Sleep
#: a body: yields its blocking steps, is sent what each returned, returns a T
Body = Generator[Step, Any, T]


def run(body: Body[T]) -> T:
    """Drive `body` in this thread."""
    value: Any = None
    while True:
        try:
            step = body.send(value)
        except StopIteration as done:
            result: T = done.value
            return result
        try:
            value = step.run()
        except BaseException:
            body.close()
            raise


async def arun(body: Body[T]) -> T:
    """Drive `body` on the running event loop: its calls in worker threads, its sleeps
    on the loop."""
    value: Any = None
    while True:
        try:
            step = body.send(value)
        except StopIteration as done:
            result: T = done.value
            return result
        try:
            value = await step.arun()
        except BaseException:  # also a cancelled task: the body's waiter is closed
            body.close()
            raise
