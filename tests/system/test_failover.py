"""The ledger is a checkpoint too: a real failover, and a real restore, under running workers.

A primary and a streaming standby are built from the machine's Postgres binaries
(tests/pgcluster.py); two workers and a beat run on libpq's multi-host URL
(`h1:p1,h2:p2?target_session_attrs=read-write`); an agent (this test) asks for a few
hundred effects at a steady rate on two CRM accounts: one that deduplicates by key and
answers a status lookup, one that does neither. Mid-run the primary's host dies (SIGKILL
of every server process) and the standby is promoted; the agent then asks for every act
again, as a resumed agent does. Counted at the provider (the sandbox's ground truth, per
business act whatever key carried it) and in SQL on the new primary, and on the old
primary's own data directory started again afterwards (what it had committed that the
standby never received):

- synchronous replication: nothing acknowledged is lost (a commit the dying primary flushed
  but the standby never acknowledged was never acknowledged to its client either), no
  duplicate, no fence issued twice,
  nothing left moving;
- asynchronous replication with the standby held seconds behind (its WAL receiver stopped:
  work the primary committed is really lost, and the test shows it): no duplicate on the
  keyed provider, no act sent twice blind on the one without deduplication, no fence
  issued twice for one operation, no provider answer dropped: every act the provider
  applied is confirmed in the new ledger (found by its key, its lookup or an orphan
  receipt) or held for a person with the switch named;
- a restore of a base backup under running workers: the same figures.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from celery import Celery

from opledger.dev.chaos.run import stack_env
from opledger.dev.chaos.variants import KINDS, build_registry, configure_sandbox
from opledger.dev.processes import PrivateRedis, Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import DatabaseUnavailable, Ledger, Status
from opledger.ledger.migrate import upgrade
from opledger.settings import Settings
from tests.conftest import SCHEMA
from tests.forks import ForkedProc
from tests.pgcluster import Cluster, Server, cluster_or_skip, multi_host_url

pytestmark = [pytest.mark.system, pytest.mark.own_processes, pytest.mark.timeout(600)]

KEYED = next(k for k in KINDS if k.name == "keyed+status")
NO_DEDUP = next(k for k in KINDS if k.name == "no-dedup")
#: an update applies again every time it is sent (a close would answer "already closed"):
#: the provider's count per act is then the number of times the act was applied
KEYED_ACTION = f"{KEYED.namespace}.update_case.v1"
NO_DEDUP_ACTION = f"{NO_DEDUP.namespace}.update_case.v1"
TENANT = "acme"
RUN = "failover"
#: how many acts the agent asks for, and how fast
ACTS = 120
PER_SECOND = 10.0


def acts() -> list[tuple[str, str]]:
    """(intent key, action) of each act, alternating the two providers."""
    return [(f"act-{i}", KEYED_ACTION if i % 2 == 0 else NO_DEDUP_ACTION) for i in range(ACTS)]


def act_key(intent_key: str, action: str) -> str:
    """The sandbox's name for the business act: a CRM update of one case on one account."""
    account = KEYED.account if action == KEYED_ACTION else NO_DEDUP.account
    return f"crm:{account}:update:case-{intent_key}"


@dataclass
class Run:
    """One failover run: its cluster, services, workers and the agent's ledger."""

    cluster: Cluster
    servers: list[Server]
    url: str
    sandbox: Sandbox
    stack: Stack
    ledger: Ledger
    publisher: Celery  #: the agent's own Celery app: this process's default app is untouched
    asked: dict[str, str] = field(default_factory=dict)  #: intent key -> op id last asked
    #: the last commit the standby had replayed when the primary died (`fail_over`)
    replayed_until: datetime | None = None

    def ask(self, intent_key: str, action: str) -> None:
        """The agent asks for one act and publishes it (what `Effects.effect` does)."""
        for attempt in range(60):
            try:
                op = self.ledger.prepare(
                    tenant=TENANT,
                    workflow_id=RUN,
                    intent_key=intent_key,
                    action=action,
                    target=f"case-{intent_key}",
                    payload={"fields": {"stage": f"followed up ({intent_key})"}},
                    authorization_ref="auth_failover",
                )
                break
            except DatabaseUnavailable:  # the primary is gone: the agent tries again
                if attempt == 59:
                    raise
                time.sleep(0.25)
        self.asked[intent_key] = op.id
        if op.status is Status.PREPARED:
            self.publisher.send_task("opledger.dispatch", args=(op.id,))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Celery]:
    """One Redis for the module's runs (emptied before each), and the agent's own Celery
    app publishing to it: this process's default Celery app, which other tests share, is
    never pointed anywhere else."""
    redis = PrivateRedis(tmp_path_factory.mktemp("failover-broker"))
    redis.start()
    publisher = Celery("failover-agent", set_as_current=False)
    publisher.config_from_object("opledger.celeryconfig")
    publisher.conf.broker_url = redis.url
    try:
        yield publisher
    finally:
        publisher.close()
        redis.kill()


@pytest.fixture
def run_for(tmp_path: Path, broker: Celery) -> Iterator[Any]:
    """`run_for(synchronous=..., standby=...)`: a cluster, a private Redis, the sandbox's
    CRM kinds, the ledger migrated on the primary, two workers and a beat on the multi-host
    URL. Everything is stopped however the test ends."""
    started: list[Any] = []

    def make(*, synchronous: bool, standby: bool = True) -> Run:
        cluster = cluster_or_skip(tmp_path, synchronous=synchronous)
        started.append(cluster.close)
        servers = [cluster.primary]
        if standby:
            servers.append(cluster.add_standby("standby1"))
        url = multi_host_url(servers)
        upgrade(cluster.primary.url())
        import redis as redis_client

        with redis_client.Redis.from_url(broker.conf.broker_url) as emptied:
            emptied.flushall()  # nothing of an earlier run's messages
        sandbox = Sandbox()
        sandbox.start()
        started.append(sandbox.stop)
        env = stack_env(url, broker.conf.broker_url, sandbox, tmp_path)
        env["OPLEDGER_SWITCH_SUSPECT_SECONDS"] = "3600"
        settings = Settings.from_environ(env)
        configure_sandbox(sandbox, settings)
        sandbox.configure(account=KEYED.account, processing_s=0.05)
        sandbox.configure(account=NO_DEDUP.account, processing_s=0.05)
        ledger = Ledger.from_url(url, actions=build_registry(settings))
        started.append(ledger.engine.dispose)
        ledger.grant(tenant=TENANT, scope=["*"], granted_by="test", ref="auth_failover")
        stack = Stack(env, tmp_path, name="failover", proc=ForkedProc)
        started.append(stack.stop_all)
        stack.start_worker("f1", concurrency=1)
        stack.start_worker("f2", concurrency=1)
        stack.start_beat(wait=True)
        return Run(cluster, servers, url, sandbox, stack, ledger, broker)

    yield make
    for stop in reversed(started):
        with contextlib.suppress(Exception):  # the rest must still be stopped
            stop()


def ask_at_a_steady_rate(run: Run, todo: list[tuple[str, str]], stop: threading.Event) -> None:
    """The agent: one act every 1/PER_SECOND seconds, until `todo` is done or `stop`."""
    for intent_key, action in todo:
        if stop.is_set():
            return
        run.ask(intent_key, action)
        time.sleep(1 / PER_SECOND)


def at_rest(ledger: Ledger, timeout: float) -> dict[str, str]:
    """Wait until every operation is final or held for a person; their statuses by id."""

    def done() -> dict[str, str] | None:
        try:
            with ledger.engine.connect() as conn:
                rows = conn.exec_driver_sql(
                    "SELECT o.id, o.status::text, EXISTS (SELECT 1 FROM reviews AS r "
                    "WHERE r.op_id = o.id AND r.resolved_at IS NULL) FROM operations AS o"
                ).all()
        except Exception:
            return None
        if any(s not in ("confirmed", "rejected", "cancelled") and not held for _, s, held in rows):
            return None
        return {op_id: status for op_id, status, _ in rows}

    result: dict[str, str] = wait_until(done, timeout, "every operation at rest", every=0.5)
    return result


def rows(server: Server, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(server.url(), options=f"-c search_path={SCHEMA}") as conn:
        return list(conn.execute(sql).fetchall())


@dataclass
class Figures:
    """What a run left: at the provider, in the new ledger, and on the old primary."""

    applied: dict[str, int]  #: effects per business act
    statuses: dict[str, str]  #: the new ledger's operations
    lost_operations: int  #: committed on the old primary, absent from the new ledger
    lost_attempts: int  #: claims committed on the old primary, absent from the new ledger
    lost_confirmations: int  #: confirmed on the old primary, not in the new ledger
    #: of those three, what was written well before the standby's last replayed commit: a
    #: synchronous standby had it, whatever the timing of the kill. (A commit the primary
    #: flushed but the dying host never had acknowledged by the standby is on the old
    #: primary only, and its client was told nothing: Postgres's synchronous replication
    #: promises what was acknowledged, and no client acted on the rest.)
    lost_before_cut: int
    fences_reused: list[tuple[str, int]]  #: (op, fence) claimed on both with other tokens
    untraced: list[str]  #: acts applied at the provider that the new ledger cannot account for
    switches: list[tuple[Any, ...]]
    orphans: int  #: providers' answers to claims the new ledger had forgotten


def figures(run: Run, old: Server | None) -> Figures:
    """Count what happened, once every operation is at rest: at the provider, on the new
    primary, and (`old`: the old primary, dead) on the old primary's data directory started
    again, alone, once the workers are stopped (its own view of what it had committed)."""
    statuses = at_rest(run.ledger, 240)
    applied = {k: v for k, v in run.sandbox.by_act().items() if k.startswith("crm:")}
    new = run.servers[-1]
    new_attempts = {
        (op, fence): token
        for op, fence, token in rows(new, "SELECT op_id, fence, claim_token FROM attempts")
    }
    new_ops = {op: status for op, status in rows(new, "SELECT id, status::text FROM operations")}
    lost_operations = lost_attempts = lost_confirmations = lost_before_cut = 0
    cut = run.replayed_until - CUT_MARGIN if run.replayed_until else None

    def before_cut(at: datetime) -> bool:
        return cut is not None and at < cut

    reused: list[tuple[str, int]] = []
    if old is not None:
        run.stack.stop_all()  # nothing may reach the old primary once it runs again
        run.ledger.engine.dispose()
        old.start()
        old_attempts = rows(old, "SELECT op_id, fence, claim_token, started_at FROM attempts")
        for op, fence, token, started in old_attempts:
            theirs = new_attempts.get((op, fence))
            if theirs is None:
                lost_attempts += 1
                lost_before_cut += before_cut(started)
            elif theirs != token:
                reused.append((op, fence))
        old_ops = "SELECT id, status::text, created_at, updated_at FROM operations"
        for op, status, created, updated in rows(old, old_ops):
            if op not in new_ops:
                lost_operations += 1
                lost_before_cut += before_cut(created)
            if status == "confirmed" and new_ops.get(op) != "confirmed":
                lost_confirmations += 1
                lost_before_cut += before_cut(updated)
    # every act the provider applied is accounted for by the new ledger: its intent is
    # confirmed there, or held for a person whose review names the switch
    by_intent = {
        (intent, action): (status, review)
        for intent, action, status, review in rows(
            new,
            "SELECT o.intent_key, o.action, o.status::text, "
            "(SELECT r.reason FROM reviews AS r WHERE r.op_id = o.id AND r.resolved_at IS NULL)"
            " FROM operations AS o",
        )
    }
    untraced = []
    for intent, action in acts():
        if applied.get(act_key(intent, action), 0) == 0:
            continue
        status, review = by_intent.get((intent, action), (None, None))
        if status == "confirmed" or (review is not None and "ledger switch" in review):
            continue
        untraced.append(f"{intent} {action}: {status} {review}")
    switches = rows(new, "SELECT epoch, kind, quarantined, reason FROM ledger_epochs ORDER BY 1")
    orphans = rows(new, "SELECT count(*) FROM orphan_receipts")[0][0]
    return Figures(
        applied,
        statuses,
        lost_operations,
        lost_attempts,
        lost_confirmations,
        lost_before_cut,
        reused,
        untraced,
        switches,
        orphans,
    )


#: how long before the standby's last replayed commit a write counts as surely replicated
#: (a claim or an outcome commits within milliseconds of its start)
CUT_MARGIN = timedelta(seconds=1)


def duplicates(applied: dict[str, int], account: str) -> list[str]:
    return sorted(k for k, n in applied.items() if f":{account}:" in k and n > 1)


def fail_over(run: Run, *, lag: bool) -> None:
    """The agent asks for most acts; with `lag` the standby stops receiving WAL a few
    seconds before the primary's host dies; the standby is promoted; every act is asked for
    again."""
    todo = acts()
    stop = threading.Event()
    agent = threading.Thread(
        target=ask_at_a_steady_rate, args=(run, todo[: ACTS * 3 // 4], stop), daemon=True
    )
    agent.start()
    wait_until(lambda: len(run.asked) >= ACTS // 3, 60, "a third of the acts asked")
    primary, standby = run.servers
    if lag:
        standby.pause_replication()
        time.sleep(2.5)  # what the primary commits now never reaches the standby
    primary.stop_hard()
    # what the standby had when the primary died: a synchronous one, every acknowledged
    # commit (its clock is the machine's, as the primary's was)
    run.replayed_until = rows(standby, "SELECT pg_last_xact_replay_timestamp()")[0][0]
    standby.promote()
    agent.join(timeout=120)
    stop.set()
    for intent_key, action in random.Random(7).sample(todo, len(todo)):  # asked again
        run.ask(intent_key, action)


def check_switched_once(f: Figures) -> None:
    assert [(e, k) for e, k, _q, _r in f.switches][:1] == [(0, "initial")]
    assert len([s for s in f.switches if s[1] != "initial"]) == 1, f.switches


def test_synchronous_failover_loses_nothing(run_for: Any) -> None:
    run: Run = run_for(synchronous=True)
    fail_over(run, lag=False)
    f = figures(run, run.servers[0])
    assert run.replayed_until is not None
    assert f.lost_before_cut == 0, f  # nothing acknowledged was lost
    assert f.fences_reused == []
    assert duplicates(f.applied, KEYED.account) == []
    assert duplicates(f.applied, NO_DEDUP.account) == []
    assert f.untraced == []
    check_switched_once(f)
    assert sum(f.applied.values()) > 0


def test_asynchronous_failover_behind_never_repeats_an_effect_nor_drops_an_answer(
    run_for: Any,
) -> None:
    run: Run = run_for(synchronous=False)
    fail_over(run, lag=True)
    f = figures(run, run.servers[0])
    print(
        f"lost: {f.lost_operations} operations, {f.lost_attempts} claims, "
        f"{f.lost_confirmations} confirmations; applied "
        f"{sum(n for k, n in f.applied.items() if KEYED.account in k)} keyed and "
        f"{sum(n for k, n in f.applied.items() if NO_DEDUP.account in k)} undeduplicated "
        f"acts; held for a person {sum(1 for s in f.statuses.values() if s == 'unknown')}; "
        f"orphan receipts {f.orphans}; switches {f.switches[1:]}"
    )
    # the switch really lost committed work: operations and claims the workers acted on
    assert f.lost_operations > 0 and f.lost_attempts + len(f.fences_reused) > 0, f
    assert duplicates(f.applied, KEYED.account) == []
    assert duplicates(f.applied, NO_DEDUP.account) == []  # never sent a second time blind
    assert f.fences_reused == []
    assert f.untraced == []
    check_switched_once(f)


def test_a_restore_under_running_workers_never_repeats_an_effect(run_for: Any) -> None:
    run: Run = run_for(synchronous=False, standby=False)
    (server,) = run.servers
    todo = acts()
    first, rest = todo[: ACTS // 4], todo[ACTS // 4 :]
    for intent_key, action in first:
        run.ask(intent_key, action)
    at_rest(run.ledger, 120)
    backup = server.base_backup("before")
    stop = threading.Event()
    agent = threading.Thread(
        target=ask_at_a_steady_rate, args=(run, rest[: len(rest) // 2], stop), daemon=True
    )
    agent.start()
    agent.join(timeout=120)
    time.sleep(1.0)
    before = rows(server, "SELECT count(*) FROM operations")[0][0]
    server.restore_from(backup)
    after = rows(server, "SELECT count(*) FROM operations")[0][0]
    assert after < before  # the restore really took operations back
    for intent_key, action in random.Random(7).sample(todo, len(todo)):
        run.ask(intent_key, action)
    f = figures(run, None)
    assert duplicates(f.applied, KEYED.account) == []
    assert duplicates(f.applied, NO_DEDUP.account) == []
    assert f.untraced == []
    assert [s[1] for s in f.switches].count("rewind") == 1, f.switches


def test_the_beat_never_takes_its_lock_on_a_standby(tmp_path: Path) -> None:
    """Advisory locks work on a standby too: one taken there would not keep a second beat
    off the primary."""
    from opledger.tasks.beat import BeatLock

    with cluster_or_skip(tmp_path, synchronous=False) as cluster:
        standby = cluster.add_standby("standby1")
        with pytest.raises(psycopg.OperationalError, match="standby"):
            BeatLock(standby.url(), schema=SCHEMA)
        lock = BeatLock(multi_host_url([standby, cluster.primary]), schema=SCHEMA)
        try:
            with cluster.primary.connect() as conn:
                held = conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                ).fetchone()
            assert held == (1,)
        finally:
            lock.release()
