"""Setup mistakes end in one clear line, never a traceback, and change nothing.

Each case runs the real command in an empty directory with only the variables it names
(no development mode), and asserts: a non-zero exit, at most three lines on stderr, the
line names what to fix, and nothing was created (no database, no state directory).

Each command is a process of its own, forked from one that imported `opledger` once
(`tests.consoles.opledger_forked`): its exit status and stderr are a real process's, without
a second or two of imports each.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from opledger.ledger import Ledger
from tests.conftest import SCHEMA, PostgresServer, require_rabbitmq, truncate_all
from tests.consoles import Job, opledger_forked
from tests.intents import prepare


def _base() -> dict[str, str]:
    # the ledger's schema too: the tests' databases are migrated into it
    return {
        k: v
        for k, v in os.environ.items()
        if k in ("PATH", "HOME", "LANG", "OPLEDGER_DATABASE_SCHEMA")
    }


def job(cwd: Path, *args: str, **env: str) -> Job:
    """`opledger ARGS` in `cwd` with only the variables named (and PATH, HOME, LANG)."""
    return Job(args, {**_base(), **env}, cwd)


def run(*jobs: Job, together: bool = False) -> list[subprocess.CompletedProcess[str]]:
    """Each job in a process of its own (forked from one that imported the command with
    none of the variables), one after the other or `together`."""
    return opledger_forked(*jobs, together=together)


def databases(server: PostgresServer) -> set[str]:
    libpq = make_url(server.url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(libpq, autocommit=True) as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database")}


@pytest.fixture(autouse=True)
def _empty_ledger(database_url: str) -> None:
    """Each test starts from an empty ledger: what an earlier test of this pytest process
    left there (an operation held for want of an adapter, say) would be warned about."""
    truncate_all(database_url)


def ticked(ledger: Ledger) -> None:
    """A beat ticked a moment ago (its heartbeat, as its scheduler writes it): `check`
    fails without one."""
    ledger.beat_heartbeat(host="beat-host", pid=1, started_at=datetime.now(UTC))


@pytest.fixture(scope="module")
def empty_db(pg_server: PostgresServer) -> Iterator[str]:
    url = pg_server.create_database("opledger_unmigrated")
    yield url
    pg_server.drop_database(url)


def refused(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert result.returncode == 4, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 3, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    return result.stderr


CASES = {
    "nothing configured": ({}, ["OPLEDGER_DATABASE_URL is not set"]),
    "a misspelled variable": (
        {"OPLEDGER_DATABASE_ULR": "postgresql://x/y"},
        ["OPLEDGER_DATABASE_URL is not set", "OPLEDGER_DATABASE_ULR is set, a typo?"],
    ),
    "another name for the database's variable": (
        {"OPLEDGER_DB_URL": "postgresql://x/y", "OPLEDGER_BROKER_URL": "{redis}"},
        ["OPLEDGER_DATABASE_URL is not set", "OPLEDGER_DB_URL is set, a typo?"],
    ),
    "no broker": ({"OPLEDGER_DATABASE_URL": "{db}"}, ["OPLEDGER_BROKER_URL is not set"]),
    "a lease that is not a number": (
        {"OPLEDGER_DATABASE_URL": "{db}", "OPLEDGER_LEASE_SECONDS": "abc"},
        ["OPLEDGER_LEASE_SECONDS", "'abc'"],
    ),
    "a MySQL URL": (
        {"OPLEDGER_DATABASE_URL": "mysql://u@localhost/db", "OPLEDGER_BROKER_URL": "{redis}"},
        ["OPLEDGER_DATABASE_URL", "postgresql://"],
    ),
    "an unsupported broker": (
        {"OPLEDGER_DATABASE_URL": "{db}", "OPLEDGER_BROKER_URL": "mysql://u@h/db"},
        ["OPLEDGER_BROKER_URL", "redis://"],
    ),
    "in-flight below the timeout": (
        {
            "OPLEDGER_DATABASE_URL": "{db}",
            "OPLEDGER_BROKER_URL": "{redis}",
            "OPLEDGER_PROVIDER_IN_FLIGHT_SECONDS": "1",
        },
        ["OPLEDGER_PROVIDER_IN_FLIGHT_SECONDS (1)", "OPLEDGER_PROVIDER_TIMEOUT_SECONDS"],
    ),
    "Postgres on the wrong port": (
        {
            "OPLEDGER_DATABASE_URL": "postgresql://root@127.0.0.1:1/x",
            "OPLEDGER_BROKER_URL": "{redis}",
        },
        ["postgres:", "port 1"],
    ),
    "a database role that does not exist": (
        {
            "OPLEDGER_DATABASE_URL": "{no_role}",
            "OPLEDGER_BROKER_URL": "{redis}",
        },
        ["postgres:", 'role "no_such_role" does not exist'],
    ),
    "an unmigrated database": (
        {"OPLEDGER_DATABASE_URL": "{empty}", "OPLEDGER_BROKER_URL": "{redis}"},
        ["schema", "opledger migrate"],
    ),
    "the broker down": (
        {"OPLEDGER_DATABASE_URL": "{db}", "OPLEDGER_BROKER_URL": "redis://127.0.0.1:1/0"},
        ["broker:", "127.0.0.1:1"],
    ),
}


def test_the_worker_refuses_each_broken_setup_in_one_line(
    tmp_path_factory: pytest.TempPathFactory,
    pg_server: PostgresServer,
    database_url: str,
    empty_db: str,
    redis_server: str,
) -> None:
    before = databases(pg_server)

    # one empty directory per case
    cwds = {case: tmp_path_factory.mktemp("cwd") for case in CASES}

    urls = {
        "db": database_url,
        "empty": empty_db,
        "redis": f"{redis_server}/0",
        # the test server, as a role it does not have
        "no_role": make_url(pg_server.url)
        .set(drivername="postgresql", username="no_such_role", password=None)
        .set(database="postgres")
        .render_as_string(hide_password=False),
    }
    jobs = [
        job(cwds[case], "worker", **{k: v.format(**urls) for k, v in env.items()})
        for case, (env, _) in CASES.items()
    ]
    results = run(*jobs, together=True)  # each case is its own process
    for case, cwd, result in zip(CASES, cwds.values(), results, strict=True):
        try:
            refused(result, *CASES[case][1])
        except AssertionError as exc:
            raise AssertionError(f"{case}: {exc}") from None
        assert list(cwd.iterdir()) == [], case  # no state directory, no embedded server
    # no ledger database created (other suites may create their own test databases meanwhile)
    assert "opledger" not in databases(pg_server) - before


def test_check_reports_every_part_and_passes_on_a_good_setup(
    tmp_path: Path, ledger: Ledger, database_url: str, redis_server: str
) -> None:
    redis = f"{redis_server}/5"
    ticked(ledger)  # a good setup runs a beat
    ok, bad = run(
        job(tmp_path, "check", OPLEDGER_DATABASE_URL=database_url, OPLEDGER_BROKER_URL=redis),
        job(tmp_path, "check", OPLEDGER_DATABASE_URL=database_url),
        together=True,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # where it reached: the Redis database number is part of it; the ledger's schema too
    assert f"reachable ({redis_server}/5)" in ok.stdout, ok.stdout
    assert f'"{SCHEMA}" at the latest migration' in ok.stdout, ok.stdout
    names = [line.split(":")[0] for line in ok.stdout.splitlines()]
    assert names == [
        "ok   adapters",
        "ok   settings",
        "warn payloads",  # no OPLEDGER_PAYLOAD_KEYS: stored in clear
        "ok   postgres",
        "ok   schema",
        "ok   actions",
        "warn replication",  # the test server streams to no standby: a failover is a restore
        "ok   ledger epoch",
        "ok   beat lock",
        "ok   beat",
        "ok   broker",
    ]
    assert "warn replication: no standby streams from this server" in ok.stdout, ok.stdout
    assert "ok   ledger epoch: no switch recorded (epoch 0)" in ok.stdout, ok.stdout
    assert bad.returncode == 4 and "FAIL broker: OPLEDGER_BROKER_URL is not set" in bad.stdout
    assert "ok   beat: ticked" in ok.stdout and "ok   beat: ticked" in bad.stdout


def test_a_variable_that_means_a_setting_is_named_at_every_start(
    tmp_path: Path, database_url: str
) -> None:
    """OPLEDGER_DB_URL set beside the real setting: `check`, the worker and the beat each
    say which setting it likely means (it was once taken for OPLEDGER_CRM_URL)."""
    env = {
        "OPLEDGER_DATABASE_URL": database_url,
        "OPLEDGER_DB_URL": "postgresql://elsewhere/db",
        "OPLEDGER_BROKER_URL": "redis://127.0.0.1:1/0",  # refused after the warnings
    }
    check, worker, beat = run(
        job(tmp_path, "check", **env), job(tmp_path, "worker", **env), job(tmp_path, "beat", **env)
    )
    meant = "OPLEDGER_DB_URL (did you mean OPLEDGER_DATABASE_URL?)"
    assert f"warn variables: not settings, a typo? {meant}" in check.stdout, check.stdout
    for name, result in (("worker", worker), ("beat", beat)):
        assert result.returncode == 4, (name, result.stdout, result.stderr)
        warning = f"opledger {name}: warning: variables: not settings, a typo? {meant}"
        assert warning in result.stderr, (name, result.stderr)


def test_a_queue_declared_as_another_type_is_refused_in_one_line(
    tmp_path: Path, ledger: Ledger, database_url: str
) -> None:
    """Switching OPLEDGER_RABBITMQ_QUEUE_TYPE under queues that exist: RabbitMQ refuses to
    redeclare them (PRECONDITION_FAILED), and the worker would restart its consumer on that
    channel error forever. Its startup checks declare the queues first and refuse."""
    from kombu.connection import Connection

    from opledger.dev.processes import PrivateVhost
    from opledger.queues import queues_of

    require_rabbitmq()
    vhost = PrivateVhost()
    vhost.start()
    try:
        with Connection(vhost.url) as conn:  # type: ignore[no-untyped-call]  # kombu: untyped
            channel = conn.channel()
            for queue in queues_of("classic", vhost.url):
                queue(channel).declare()  # type: ignore[no-untyped-call]  # kombu: untyped
        env = {"OPLEDGER_DATABASE_URL": database_url, "OPLEDGER_BROKER_URL": vhost.url}
        ticked(ledger)
        worker, check = run(
            job(tmp_path, "worker", **env, OPLEDGER_RABBITMQ_QUEUE_TYPE="quorum"),
            job(tmp_path, "check", **env, OPLEDGER_RABBITMQ_QUEUE_TYPE="quorum"),
        )
        refused(
            worker,
            "broker: queue 'dispatch' and its exchange cannot be declared as "
            "OPLEDGER_RABBITMQ_QUEUE_TYPE=quorum says",
            "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'dispatch'",
            "new virtual host",
        )
        # `check` only reads: it passes with the type the queues do not have
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        vhost.kill()


def test_quorum_queues_on_redis_are_a_warning_naming_the_setting() -> None:
    from opledger.cli.checks import run_checks

    env = {
        "OPLEDGER_BROKER_URL": "redis://127.0.0.1:6379/0",
        "OPLEDGER_RABBITMQ_QUEUE_TYPE": "quorum",
    }
    checks = run_checks(env, broker=False, database=False)
    queues = [c for c in checks if c.name == "queues"]
    assert len(queues) == 1 and queues[0].warning, checks
    assert "OPLEDGER_RABBITMQ_QUEUE_TYPE=quorum has no effect" in queues[0].detail
    amqp = {**env, "OPLEDGER_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//"}
    assert not [c for c in run_checks(amqp, broker=False, database=False) if c.name == "queues"]
    # no global prefetch: a reserved message may wait for a task of each queue first
    slow = {**amqp, "OPLEDGER_TASK_TIME_LIMIT_SECONDS": "400"}
    warned = [c for c in run_checks(slow, broker=False, database=False) if c.name == "queues"]
    assert len(warned) == 1 and warned[0].warning and "2000 s" in warned[0].detail, warned


def test_beat_refuses_a_schedule_it_cannot_write_and_the_worker_passes_options_on(
    tmp_path: Path, database_url: str, redis_server: str
) -> None:
    env = {"OPLEDGER_DATABASE_URL": database_url, "OPLEDGER_BROKER_URL": f"{redis_server}/0"}
    unwritable = "/proc/opledger-cannot-write-here/schedule"
    (tmp_path / "beat").mkdir()
    beat, celery = run(
        job(tmp_path / "beat", "beat", "--schedule", unwritable, **env),
        job(tmp_path, "worker", "--", "--help", **env),
        together=True,
    )
    refused(beat, "cannot write", "--schedule")
    assert list((tmp_path / "beat").iterdir()) == []
    # options after `--` go to Celery's own worker unchanged (its --help exits at once)
    assert celery.returncode == 0, celery.stderr
    assert "--max-tasks-per-child" in celery.stdout


def test_open_operations_of_an_unserved_action_are_a_warning_and_every_process_starts(
    tmp_path: Path, ledger: Ledger, database_url: str, redis_server: str
) -> None:
    """A mistyped action prepared through a ledger that does not know the adapters (its
    `PrefixResolver` accepts any well-formed action) is listed, with how many operations
    name it, and stops nothing: `check` passes, the worker and the beat start."""
    bare = Ledger(ledger.engine)  # Ledger.from_url(url) without actions=: no registry
    bare.grant(tenant="acme", scope=["*"], granted_by="test", ref="auth_acme")
    prepare(bare, "typo-1", action="crm.close_cse.v1")
    prepare(bare, "typo-2", action="crm.close_cse.v1")
    prepare(bare, "other", action="crm.reopen_case.v1")
    prepare(bare, "served")
    env = {"OPLEDGER_DATABASE_URL": database_url, "OPLEDGER_BROKER_URL": f"{redis_server}/0"}
    schema = os.environ.get("OPLEDGER_DATABASE_SCHEMA")  # the suite's ledger schema, if any
    if schema:
        env["OPLEDGER_DATABASE_SCHEMA"] = schema
    unwritable = "/proc/opledger-cannot-write-here/schedule"
    ticked(ledger)
    try:
        checked, lines, worker, beat = run(
            job(tmp_path, "check", "--json", **env),
            job(tmp_path, "check", **env),
            # the worker's `--help` after `--` exits at once, once its start-up checks pass
            job(tmp_path, "worker", "--", "--help", **env),
            job(tmp_path, "beat", "--schedule", unwritable, **env),
            together=True,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        (actions,) = [c for c in json.loads(checked.stdout) if c["name"] == "actions"]
        assert actions["warning"] and not actions["ok"], actions
        assert (
            "open operations name actions no adapter serves: crm.close_cse.v1 (2 operations), "
            "crm.reopen_case.v1 (1 operation); they are held, not sent"
        ) in actions["detail"]
        assert "crm.close_case.v1" not in actions["detail"]  # served: not listed
        assert lines.returncode == 0, lines.stdout + lines.stderr
        assert "warn actions: open operations name actions no adapter serves" in lines.stdout
        # the worker's start-up checks pass (its `--help` after `--` then exits at once)
        assert worker.returncode == 0, worker.stderr
        assert "--max-tasks-per-child" in worker.stdout
        assert "warning: actions:" in worker.stderr and "crm.close_cse.v1" in worker.stderr
        # the beat's too: what stops this one is the schedule it cannot write, after them
        assert beat.returncode == 4 and "cannot write the beat schedule" in beat.stderr
        assert "warning: actions:" in beat.stderr
    finally:
        truncate_all(database_url)
