"""System fixtures: one shared stack of real processes for the whole session.

A private Redis, the sandbox providers, one `opledger worker` (prefork, two processes)
and one `opledger beat`, all against the session's test database, with short leases and
sweep intervals so recovery happens in seconds. Tests that kill or stop the worker get a
fresh one afterwards; a test that needs a worker of another environment (a crash point, a
shorter lease, JSON logs) takes it with `worker_with`, which puts the plain `w1` back
however the test ends.

A test that parametrizes `broker` with "rabbitmq" gets the same stack on RabbitMQ instead:
a virtual host of the session's own on the machine's server (`rabbitmqctl`), deleted at the
end of the session, so parallel runs and leftovers never share a queue. Only one stack
runs at a time (both share the database): switching stops the other's processes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from opledger.adapters.registry import load_registry
from opledger.dev.chaos.run import stack_env
from opledger.dev.processes import (
    PrivateRedis,
    PrivateVhost,
    Proc,
    Stack,
    use_broker,
    wait_until,
)
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.settings import Settings
from tests import stacks
from tests.conftest import require_rabbitmq
from tests.forks import ForkedProc


@pytest.fixture
def own_env(database_url: str) -> dict[str, str]:
    """What a test of `own_processes` hands the run it starts: the path, the home and the
    Postgres server to make its scratch databases on (it brings its broker, providers and
    workers)."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME")}
    return {**env, "OPLEDGER_DATABASE_URL": database_url}


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
    stack = stacks.keep(
        Stack(
            stack_env(database_url, private_redis.url, sandbox_server, workdir),
            workdir,
            proc=ForkedProc,
        )
    )
    try:
        yield stack
    finally:
        stack.stop_all()
        app.pool.force_close_all()


@pytest.fixture(scope="session")
def rabbit_vhost() -> Iterator[PrivateVhost]:
    require_rabbitmq()
    vhost = PrivateVhost()
    vhost.start()
    try:
        yield vhost
    finally:
        vhost.kill()


@pytest.fixture(scope="session")
def rabbit_stack(
    database_url: str, rabbit_vhost: PrivateVhost, sandbox_server: Sandbox, workdir: Path
) -> Iterator[Stack]:
    env = stack_env(database_url, rabbit_vhost.url, sandbox_server, workdir)
    stack = stacks.keep(Stack(env, workdir, name="rabbitmq", proc=ForkedProc))
    try:
        yield stack
    finally:
        stack.stop_all()


@pytest.fixture
def broker() -> str:
    """The broker `running` runs on: "redis", unless a test parametrizes it."""
    return "redis"


@pytest.fixture
def running(
    request: pytest.FixtureRequest, broker: str, stack: Stack, ledger: Ledger, sandbox: Sandbox
) -> Iterator[Stack]:
    """The stack with a live worker `w1` and beat; empty ledger; sandbox reset."""
    from opledger.tasks.app import app

    active = stack
    if broker == "rabbitmq":
        active = request.getfixturevalue("rabbit_stack")
        stack.stop_all()  # one stack at a time: the Redis one's beat would sweep these ops
        use_broker(app, active.env["OPLEDGER_BROKER_URL"])
    elif broker != "redis":
        raise ValueError(f"unknown broker {broker!r}")
    if "w1" not in active.workers or active.workers["w1"].proc.poll() is not None:
        active.workers.pop("w1", None)
        active.start_worker("w1")
    if active.beat is None or active.beat.proc.poll() is not None:
        # past its startup checks before the test breaks anything (a broker it checks
        # while a test deletes it refuses it, and it exits)
        active.start_beat(wait=True)
    try:
        yield active
    finally:
        if active is not stack:  # back to the session's Redis stack for the next test
            active.stop_all()
            use_broker(app, stack.env["OPLEDGER_BROKER_URL"])


def settings_of(env: dict[str, str]) -> Settings:
    """The settings a process started with `env` reads."""
    return Settings.from_environ(env)


@pytest.fixture
def sys_ledger(ledger: Ledger, stack: Stack) -> Ledger:
    """A ledger wired to the same adapter registry as the workers."""
    system = Ledger(ledger.engine, actions=load_registry(settings_of(stack.env)))
    system.grant(tenant="acme", scope=["*"], granted_by="test", ref="auth_acme")
    return system


@contextmanager
def worker_with(stack: Stack, name: str = "w1", concurrency: int = 2, **env: str) -> Iterator[Proc]:
    """The shared worker `w1` replaced, for the block, by a worker `name` started with
    `env` (yielded). Leaving the block, passed or failed, stops every worker started since
    (that one, and any the block started, such as a `w1` of its own environment) and starts
    the plain `w1` again: the next test never finds the stack without its worker, nor a
    worker of another test's environment."""
    if "w1" in stack.workers:
        stack.kill_worker("w1")
    before = set(stack.workers) - {name}
    try:
        yield stack.start_worker(name, concurrency, **env)
    finally:
        for started in set(stack.workers) - before:
            stack.kill_worker(started)
        stack.start_worker("w1")


#: what a worker logs when one of its pool processes is SIGKILLed (a crash point fired)
KILLED = re.compile(r"exited with 'signal 9 \(SIGKILL\)'")


def crashes(worker: Proc) -> int:
    """How many of the worker's pool processes were SIGKILLed so far."""
    return len(KILLED.findall(worker.output()))


def settled(ledger: Ledger, op_ids: list[str], timeout: float = 30.0) -> dict[str, Status]:
    """Wait until every operation is final or unknown with an open review."""

    def done() -> dict[str, Status] | None:
        result = {}
        for op_id in op_ids:
            history = ledger.history(op_id)
            if not history.at_rest:
                return None
            result[op_id] = history.operation.status
        return result

    try:
        statuses: dict[str, Status] = wait_until(
            done, timeout, f"{len(op_ids)} operations to settle", every=0.2
        )
        return statuses
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
