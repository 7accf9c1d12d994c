"""System fixtures: one shared stack of real processes for the whole session.

A private Redis, the sandbox providers, one `opledger worker` (prefork, two processes)
and one `opledger beat`, all against the session's test database, with short leases and
sweep intervals so recovery happens in seconds. Tests that kill or stop the worker get a
fresh one afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opledger.adapters.registry import load_registry
from opledger.dev.chaos.audit import settled as is_settled
from opledger.dev.chaos.run import stack_env
from opledger.dev.chaos.stack import PrivateRedis, Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.settings import Settings


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("system")


@pytest.fixture(scope="session")
def private_redis(workdir: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(workdir)
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def stack(
    database_url: str, private_redis: PrivateRedis, sandbox_server: Sandbox, workdir: Path
) -> Iterator[Stack]:
    from opledger.tasks.app import app

    app.conf.broker_url = private_redis.url  # this process publishes to the private broker
    stack = Stack(stack_env(database_url, private_redis.url, sandbox_server, workdir), workdir)
    try:
        yield stack
    finally:
        stack.stop_all()
        app.pool.force_close_all()


@pytest.fixture
def running(stack: Stack, ledger: Ledger, sandbox: Sandbox) -> Stack:
    """The stack with a live worker `w1` and beat; empty ledger; sandbox reset."""
    if "w1" not in stack.workers or stack.workers["w1"].proc.poll() is not None:
        stack.workers.pop("w1", None)
        stack.start_worker("w1")
    if stack.beat is None or stack.beat.proc.poll() is not None:
        stack.start_beat()
    return stack


def settings_of(env: dict[str, str]) -> Settings:
    """The settings a process started with `env` reads."""
    return Settings.from_environ(env)


@pytest.fixture
def sys_ledger(ledger: Ledger, stack: Stack) -> Ledger:
    """A ledger wired to the same adapter registry as the workers."""
    system = Ledger(ledger.engine, actions=load_registry(settings_of(stack.env)))
    system.grant(tenant="acme", scope=["*"], granted_by="test", ref="auth_acme")
    return system


def prepare(
    ledger: Ledger,
    key: str,
    *,
    action: str = "crm.close_case.v1",
    target: str = "case-318",
    payload: dict[str, Any] | None = None,
) -> str:
    return ledger.prepare(
        tenant="acme",
        workflow_id="onboarding-42",
        intent_key=key,
        action=action,
        target=target,
        payload=payload if payload is not None else {"note": "resolved"},
        authorization_ref="auth_acme",
    ).id


def settled(ledger: Ledger, op_ids: list[str], timeout: float = 30.0) -> dict[str, Status]:
    """Wait until every operation is final or unknown with an open review."""

    def done() -> dict[str, Status] | None:
        result = {}
        for op_id in op_ids:
            history = ledger.history(op_id)
            if not is_settled(history):
                return None
            result[op_id] = history.operation.status
        return result

    try:
        return wait_until(done, timeout, f"{len(op_ids)} operations to settle", every=0.2)
    except AssertionError as exc:
        lines = []
        for op_id in op_ids:
            h = ledger.history(op_id)
            lines.append(
                f"{op_id} {h.operation.action} {h.operation.status} fence={h.operation.fence} "
                f"next_check={h.operation.next_check_at} attempts={len(h.attempts)} "
                f"reviews={len(h.reviews)} evidence={[(e.source, e.verdict) for e in h.evidence]}"
            )
        raise AssertionError(f"{exc}\n" + "\n".join(lines)) from None
