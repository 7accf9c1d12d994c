"""`opledger demo`: the onboarding story, then the same story broken at every crash window.

An agent closes case-318 in the CRM and emails the account owner: two operations. The
demo runs that story on real parts (Postgres, Redis, a Celery worker and beat, sandbox
providers over HTTP and SMTP), then breaks it at each crash window of the design — killing
the worker process for real — and shows, per scenario, what was broken, how each operation
ended, how many times the provider applied it, and whether a person was asked to decide.

Without OPLEDGER_DATABASE_URL / OPLEDGER_BROKER_URL it starts an embedded Postgres and an
embedded Redis of its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from opledger.adapters.registry import load_registry
from opledger.dev import devstack
from opledger.dev.chaos.audit import Audit, audit, effect_key, settled
from opledger.dev.chaos.run import stack_env
from opledger.dev.chaos.stack import PrivateRedis, Proc, Stack, free_port, use_broker, wait_until
from opledger.dev.chaos.variants import KINDS, configure_sandbox
from opledger.dev.sandbox import Sandbox
from opledger.ledger import IntentConflict, Ledger
from opledger.ledger.migrate import upgrade
from opledger.settings import Settings

OWNER = "owner@acme.test"
CASE = "case-318"
KILLED = "exited with 'signal 9 (SIGKILL)'"


@dataclass
class Row:
    scenario: str
    broken: str
    outcome: str
    effects: str
    review: str


@dataclass
class Services:
    """What the demo runs on, and how to stop (or keep) it."""

    database_url: str
    broker_url: str
    redis: PrivateRedis | None
    postgres: devstack.EmbeddedPostgres | None  # when we started it
    workdir: Path
    cleanup: list[Callable[[], None]] = field(default_factory=list)


@contextlib.contextmanager
def services(keep: bool) -> Iterator[Services]:
    """Postgres, Redis and a work directory for the demo. Unless kept, everything started
    here is stopped and the temporary directory removed, also when interrupted."""
    with contextlib.ExitStack() as stack:
        configured_dir = os.environ.get("OPLEDGER_STATE_DIR")
        workdir = Path(configured_dir or tempfile.mkdtemp(prefix="opledger-demo-")).resolve()
        if not configured_dir and not keep:
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        workdir.mkdir(parents=True, exist_ok=True)
        postgres = None
        server_url = os.environ.get("OPLEDGER_DATABASE_URL")
        if not server_url:
            postgres = devstack.EmbeddedPostgres(workdir / "postgres")
            if not keep:
                stack.callback(postgres.stop)
            server_url = postgres.url
        if os.environ.get("OPLEDGER_DATABASE_URL"):
            database_url = server_url  # the configured ledger: migrate it and use it
            upgrade(database_url)
        else:
            database_url, drop_database = devstack.scratch_database(server_url, "opledger_demo")
            if not keep:
                stack.callback(_quietly, drop_database)
        redis = None
        broker_url = os.environ.get("OPLEDGER_BROKER_URL", "")
        if not broker_url:
            redis = PrivateRedis(workdir)
            if not keep:
                stack.callback(redis.kill)
            redis.start()
            broker_url = redis.url
        svc = Services(database_url, broker_url, redis, postgres, workdir)
        if not keep:
            stack.callback(_stop_all, svc.cleanup)
        yield svc


def _stop_all(cleanup: list[Callable[[], None]]) -> None:
    for stop in reversed(cleanup):
        with contextlib.suppress(Exception):
            stop()


def _quietly(drop: Callable[[], None]) -> None:
    with contextlib.suppress(psycopg.Error):
        drop()


class Story:
    """The stack and the helpers each scenario uses."""

    def __init__(self, svc: Services, sandbox: Sandbox) -> None:
        env = stack_env(svc.database_url, svc.broker_url, sandbox, svc.workdir)
        self.env = env
        self.svc = svc
        self.sandbox = sandbox
        self.settings = Settings.from_environ(env)
        self.stack = Stack(env, svc.workdir)
        self.ledger = Ledger.from_url(svc.database_url, actions=load_registry(self.settings))
        self.run = uuid.uuid4().hex[:6]
        self.all_ops: list[str] = []

    def start(self) -> None:
        from opledger.tasks.app import app

        use_broker(app, self.svc.broker_url)
        configure_sandbox(self.sandbox, self.settings)
        self.ledger.grant(tenant="acme", scope=["*"], granted_by="demo", ref="auth_demo_agent")
        self.stack.start_worker("agent-worker")
        self.stack.start_beat()

    # -- the two operations of the story ------------------------------------------------------

    def prepare(
        self, scenario: str, intent_key: str, *, action: str = "crm.close_case.v1", **over: Any
    ) -> str:
        """The agent's step: close case-318 (any CRM action) or email the owner (any email
        action). What it does follows from the action, so its label always says it."""
        intent: dict[str, Any]
        if action.startswith("email."):
            intent = dict(
                target=OWNER,
                payload={"to": OWNER, "subject": "Case 318 is closed", "text": "All set."},
            )
        else:
            intent = dict(target=CASE, payload={"status": "closed", "note": "Onboarding complete"})
        intent.update(over)
        op = self.ledger.prepare(
            tenant="acme",
            workflow_id=f"onboarding-42/{self.run}/{scenario}",
            intent_key=intent_key,
            action=action,
            authorization_ref="auth_demo_agent",
            **intent,
        )
        self.all_ops.append(op.id)
        return op.id

    def send(self, *op_ids: str) -> None:
        from opledger.tasks.app import dispatch

        for op_id in op_ids:
            dispatch.delay(op_id)

    def settle(self, op_ids: list[str], timeout: float = 60.0) -> None:
        def done() -> bool:
            return all(settled(self.ledger.history(op_id)) for op_id in op_ids)

        wait_until(done, timeout, "the operations to settle", every=0.2)

    def restart_worker(self, **env: str) -> None:
        self.stack.kill_worker("agent-worker")
        self.stack.start_worker("agent-worker", 2, **env)

    def fresh_providers(self) -> None:
        """A clean CRM and mailbox for the next scenario (case-318 open again)."""
        self.sandbox.reset()
        configure_sandbox(self.sandbox, self.settings)

    def crashes(self) -> int:
        return self.stack.workers["agent-worker"].output().count(KILLED)

    def row(self, scenario: str, broken: str, op_ids: list[str]) -> Row:
        truth = self.sandbox.truth()
        outcome, effects, reviews = [], [], []
        for op_id in op_ids:
            h = self.ledger.history(op_id)
            label = _label(h.operation.action, h.operation.target)
            status = h.operation.status.value
            accepted = any(
                e.detail.get("accepted_only") for e in h.evidence if e.verdict == "confirmed"
            )
            if status == "confirmed" and accepted:
                status = "confirmed (accepted, not delivered)"
            outcome.append(f"{label}: {status}")
            effects.append(f"{label}: {truth['effects'].get(effect_key(h), 0)}")
            open_reviews = [r for r in h.reviews if r.resolved_at is None]
            if open_reviews:
                reviews.append(f"{label}: {open_reviews[0].reason}")
        return Row(
            scenario, broken, "\n".join(outcome), "\n".join(effects), "\n".join(reviews) or "none"
        )


def _label(action: str, target: str) -> str:
    """What the operation does, from its own action and target."""
    if action.startswith("email."):
        who = "owner" if target == OWNER else target
        return f"email {who} (SMTP)" if action.startswith("email.smtp") else f"email {who}"
    kind = next((k for k in KINDS if k.action == action), None)
    if kind is None or kind.namespace == "crm":
        return f"close {target}"
    return f"close {target} (CRM: {kind.name})"


# -- the scenarios ------------------------------------------------------------------------------


def happy(story: Story) -> Row:
    close = story.prepare("happy", "close")
    email = story.prepare("happy", "email", action="email.send.v1")
    story.send(close, email)
    story.settle([close, email])
    return story.row("the story", "nothing", [close, email])


def crash_before_dispatch(story: Story) -> Row:
    story.restart_worker(OPLEDGER_CRASHPOINT="dispatch.before_call")
    close = story.prepare("before-dispatch", "close")
    story.send(close)
    wait_until(lambda: story.crashes() >= 1, 30, "the crash")
    story.restart_worker()
    replayed = story.prepare("before-dispatch", "close")  # the agent replays its step
    assert replayed == close, "a replayed step must not create a second intent"
    story.settle([close])
    return story.row(
        "1. crash before dispatch",
        "worker SIGKILLed after the claim, before the CRM call; the agent replayed its step "
        "(same operation came back)",
        [close],
    )


def response_dropped(story: Story) -> Row:
    story.restart_worker(OPLEDGER_CRASHPOINT="dispatch.after_call")
    close = story.prepare("response-dropped", "close")
    story.send(close)
    wait_until(lambda: story.crashes() >= 1, 30, "the crash")
    story.restart_worker()
    story.settle([close])
    return story.row(
        "2. CRM commits, response lost",
        "the CRM applied the close; the worker was SIGKILLed before saving the response; "
        "reconciled through the CRM's status API",
        [close],
    )


def receipt_lost(story: Story) -> Row:
    story.restart_worker(OPLEDGER_CRASHPOINT="dispatch.after_call")
    email = story.prepare("receipt-lost", "email", action="email.send.v1")
    smtp = story.prepare("receipt-lost", "email-smtp", action="email.smtp_send.v1")
    story.send(email, smtp)  # two pool processes: each dies after its provider answered

    def both_sent_and_crashed() -> bool:
        sent = all(story.ledger.history(o).attempts for o in (email, smtp))
        return sent and story.crashes() >= 2

    wait_until(both_sent_and_crashed, 30, "both crashes")
    story.restart_worker()
    story.settle([email, smtp])
    return story.row(
        "3. email accepted, receipt lost",
        "the provider accepted each email; the worker died before recording it. The API "
        "keeps keys (a same-key retry is safe); SMTP has no dedup and no lookup",
        [email, smtp],
    )


def two_workers(story: Story) -> Row:
    story.sandbox.configure(account="keyed-status", processing_s=0.8)
    close = story.prepare("two-workers", "close")
    story.send(close)
    wait_until(lambda: story.sandbox.truth()["requests"].get(f"crm:{close}"), 20, "the call")
    stalled = story.stack.workers["agent-worker"]
    stalled.signal(signal.SIGSTOP)
    try:
        story.stack.start_worker("second-worker")
        wait_until(lambda: story.ledger.get(close).status.final, 30, "the second worker")
    finally:
        stalled.signal(signal.SIGCONT)
    wait_until(
        lambda: any(
            e.source == "dispatch" and not e.applied for e in story.ledger.history(close).evidence
        ),
        20,
        "the stalled worker's late answer",
    )
    story.stack.kill_worker("second-worker")
    story.sandbox.configure(account="keyed-status", processing_s=0.0)
    return story.row(
        "4. two workers, lease expired",
        "worker SIGSTOPped mid-call past its lease; a second worker reconciled; the first "
        "woke up and its late answer was refused by the fence (kept as evidence)",
        [close],
    )


def unsafe_retries(story: Story) -> Row:
    close = story.prepare("unsafe", "close", payload={"status": "closed", "note": "first"})
    try:
        story.prepare("unsafe", "close", payload={"status": "closed", "note": "changed"})
        conflict = "accepted (wrong!)"
    except IntentConflict:
        conflict = "refused: IntentConflict"
    story.send(close)
    search = next(k for k in KINDS if k.name == "search")
    story.sandbox.configure(account=search.account, search_lag_s=120.0)
    lagging = story.prepare("unsafe", "close-lagging", action=search.action)
    story.sandbox.fault("crm", "drop_after_commit", key=lagging)
    story.send(lagging)
    story.settle([close, lagging])
    return story.row(
        "5. changed payload, lagging search",
        f"the agent re-sent the close with a changed payload ({conflict}); a CRM without keys "
        "lost a response and its search lags far behind: absence proves nothing",
        [close, lagging],
    )


def after_save(story: Story) -> Row:
    story.restart_worker(OPLEDGER_CRASHPOINT="dispatch.after_save")
    close = story.prepare("after-save", "close")
    email = story.prepare("after-save", "email", action="email.send.v1")
    story.send(close, email)
    wait_until(lambda: story.crashes() >= 2, 30, "the crashes")
    story.restart_worker()
    story.settle([close, email])
    return story.row(
        "+ crash after save, before ack",
        "worker SIGKILLed after each outcome was saved, before the broker ack",
        [close, email],
    )


def redis_restart(story: Story) -> Row | None:
    if story.svc.redis is None:
        return None  # a configured broker is not ours to restart
    story.stack.kill_worker("agent-worker")
    close = story.prepare("redis", "close")
    email = story.prepare("redis", "email", action="email.send.v1")
    story.send(close, email)
    story.svc.redis.restart()
    story.stack.start_worker("agent-worker")
    story.settle([close, email])
    return story.row(
        "+ Redis restarted, messages lost",
        "both messages were queued when Redis restarted without persistence; the beat relay "
        "published them again",
        [close, email],
    )


def postgres_restart(story: Story) -> Row | None:
    if story.svc.postgres is None:
        return None  # a configured database is not ours to restart
    story.sandbox.configure(account="keyed-status", processing_s=0.5)
    close = story.prepare("postgres", "close")
    email = story.prepare("postgres", "email", action="email.send.v1")
    story.send(close, email)
    wait_until(lambda: story.sandbox.truth()["requests"].get(f"crm:{close}"), 20, "the call")
    story.svc.postgres.restart()
    story.ledger.engine.dispose()
    story.sandbox.configure(account="keyed-status", processing_s=0.0)
    story.settle([close, email])
    return story.row(
        "+ Postgres restarted mid-call",
        "the ledger's Postgres restarted while the CRM call was in flight",
        [close, email],
    )


SCENARIOS = (
    happy,
    crash_before_dispatch,
    response_dropped,
    receipt_lost,
    two_workers,
    unsafe_retries,
    after_save,
    redis_restart,
    postgres_restart,
)


def run_demo(*, keep: bool, on_row: Callable[[Row], None]) -> dict[str, Any]:
    """Run every scenario; returns the audit of all operations (and URLs with keep)."""
    with services(keep) as svc:
        sandbox = Sandbox(log=str(svc.workdir / "sandbox.log")).start()
        svc.cleanup.append(sandbox.stop)
        story = Story(svc, sandbox)
        svc.cleanup.append(story.stack.stop_all)
        svc.cleanup.append(story.ledger.engine.dispose)
        story.start()
        totals = Audit()
        for scenario in SCENARIOS:
            story.fresh_providers()
            before = len(story.all_ops)
            row = scenario(story)
            if row is None:
                continue
            on_row(row)
            part = audit(story.ledger, sandbox.truth(), story.all_ops[before:])
            for name in (
                "ops",
                "confirmed",
                "rejected",
                "cancelled",
                "unknown_in_review",
                "stuck",
                "lost",
                "duplicate_effects",
                "dispatches_while_in_flight",
            ):
                setattr(totals, name, getattr(totals, name) + getattr(part, name))
            totals.problems.extend(part.problems)
        summary: dict[str, Any] = {key: value for key, value in totals.as_dict().items()}
        if keep:
            port = free_port()
            password = uuid.uuid4().hex[:12]
            flower = Proc(
                "flower",
                ["flower", "--port", str(port)],
                {**story.env, "OPLEDGER_FLOWER_PASSWORD": password},
                svc.workdir / "flower.log",
            )
            summary["urls"] = {
                "flower": f"http://opledger:{password}@127.0.0.1:{port}/",
                "sandbox": sandbox.http_url,
                "sandbox_truth": f"{sandbox.http_url}/_admin/truth",
                "database": svc.database_url,
                "broker": svc.broker_url,
                "logs": str(svc.workdir),
            }
            # Workers, beat, Flower and Redis run in process groups of their own.
            groups = [p.proc.pid for p in story.stack.workers.values()] + [flower.proc.pid]
            if story.stack.beat is not None:
                groups.append(story.stack.beat.proc.pid)
            if svc.redis is not None and svc.redis.proc is not None:
                groups.append(svc.redis.proc.pid)
            pids = [str(sandbox.detach())]
            if svc.postgres is not None:
                pids.append(str(svc.postgres.pid()))  # SIGTERM: a clean shutdown
            summary["urls"]["stop"] = "kill -- " + " ".join([f"-{pid}" for pid in groups] + pids)
        return summary
