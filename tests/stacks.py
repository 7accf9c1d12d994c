"""The system tests' stacks of real processes in this pytest process.

Each pytest worker process that takes system test files runs a stack of its own (a
Celery worker and beat against its database: `tests/system/conftest.py`). The files after
them (integration and unit tests) need no stack, and must not have one: its beat would
relay and its worker dispatch the operations an integration test prepares and inspects,
and an idle stack still costs the machine a tenth of a core. So the first test that is not
a system test stops them (`stop_all`); a system test after it starts them again."""

from __future__ import annotations

from opledger.dev.processes import Stack

_stacks: list[Stack] = []


def keep(stack: Stack) -> Stack:
    """Remember `stack`, so `stop_all` stops its processes."""
    _stacks.append(stack)
    return stack


def stop_all() -> None:
    """Stop the workers and beat of every stack of this process (its broker and providers
    stay: the stack's next test starts its processes again)."""
    for stack in _stacks:
        if stack.workers or stack.beat is not None:
            stack.stop_all()
