"""Postgres restarted mid-run: workers recover and nothing stays dispatching.

The ledger for this test lives on a Postgres of its own (the embedded server from the dev
extra), so restarting it disturbs nothing else on the machine.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from opledger.adapters.registry import load_registry
from opledger.dev.chaos.run import stack_env
from opledger.dev.devstack import EmbeddedPostgres
from opledger.dev.processes import PrivateRedis, Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.ledger.migrate import upgrade
from opledger.ledger.pgschema import beat_lock_key
from tests.conftest import SCHEMA
from tests.forks import ForkedProc
from tests.intents import key_of, prepare

from .conftest import settings_of, settled

pytestmark = pytest.mark.system


@pytest.fixture
def own_stack(
    workdir: Path, private_redis: PrivateRedis, sandbox: Sandbox, stack: Stack
) -> Iterator[tuple[Stack, Ledger, EmbeddedPostgres]]:
    stack.stop_all()  # the shared workers and beat would take this test's messages
    # Not under pytest's temporary directory: a pytest process starting on this machine
    # takes group and other access off /tmp/pytest-of-USER, and the server (run as a user of
    # its own when the tests run as root) could no longer reach its data directory.
    root = Path(tempfile.mkdtemp(prefix="opledger-restart-"))
    pg = EmbeddedPostgres(root / "own-postgres")
    url = pg.url.replace("/postgres?", "/opledger_restart?")
    import psycopg

    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS opledger_restart WITH (FORCE)")
        conn.execute("CREATE DATABASE opledger_restart")
    upgrade(url)
    env = stack_env(url, private_redis.url, sandbox, workdir)
    own = Stack(env, workdir, name="own", proc=ForkedProc)
    ledger = Ledger.from_url(url, actions=load_registry(settings_of(env)))
    ledger.grant(tenant="acme", scope=["*"], granted_by="test", ref="auth_acme")
    own.start_worker("wpg")
    own.start_beat()
    try:
        yield own, ledger, pg
    finally:
        own.stop_all()
        ledger.engine.dispose()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_postgres_restart_mid_run(
    own_stack: tuple[Stack, Ledger, EmbeddedPostgres], sandbox: Sandbox
) -> None:
    from opledger.tasks.app import dispatch

    stack, ledger, pg = own_stack
    sandbox.configure(processing_s=0.05)
    op_ids = [prepare(ledger, f"k{i}", target=f"case-{i}") for i in range(20)]
    for op_id in op_ids:
        dispatch.delay(op_id)
    wait_until(lambda: sandbox.truth()["effects"], 20, "the first effects")
    pg.restart()
    ledger.engine.dispose()  # the test's own pool died with the server too
    statuses = settled(ledger, op_ids, timeout=60)
    assert set(statuses.values()) == {Status.CONFIRMED}
    assert not ledger.list(status=[Status.DISPATCHING])
    for op_id in op_ids:
        assert sandbox.effects(f"crm:{key_of(ledger, op_id)}") == 1
    assert stack.workers["wpg"].proc.poll() is None  # the worker survived the outage


def test_the_beat_takes_its_lock_again_after_a_postgres_restart(
    own_stack: tuple[Stack, Ledger, EmbeddedPostgres],
) -> None:
    stack, _ledger, pg = own_stack
    beat = stack.beat
    assert beat is not None
    wait_until(lambda: "beat: Starting" in beat.output(), 30, "the beat to hold its lock")
    pg.restart()
    wait_until(lambda: "taking the lock again" in beat.output(), 30, "the beat to notice")
    # its lock held again (it tries every few seconds while the server comes back up)
    key = beat_lock_key(SCHEMA)
    wait_until(lambda: _lock_held(pg.url, key), 60, "the beat to hold its lock again")
    second = ForkedProc("beat2", ["beat"], stack.env, stack.workdir / "beat-after-restart.log")
    try:
        assert second.wait(timeout=60) == 4  # operational: exactly one beat may run
        assert "another opledger beat" in second.output()
    finally:
        second.kill()  # already gone when the test passes
    assert beat.proc.poll() is None  # the first beat still runs


def _lock_held(url: str, key: int) -> bool:
    """Whether some session holds the advisory lock `key` (a bigint lock is listed with
    its high and low halves as classid and objid)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND objsubid = 1 AND (classid::bigint << 32 | objid::bigint) = %s",
            [key],
        ).fetchone()
    return bool(row and row[0])
