"""The onboarding story the scenarios break: the agent's two operations, what each
scenario ran, and how it is shown; Flower, for `--keep`."""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from opledger.adapters.registry import load_registry
from opledger.dev.chaos.audit import effect_key
from opledger.dev.chaos.run import stack_env
from opledger.dev.chaos.variants import KINDS, configure_sandbox
from opledger.dev.forks import ForkedProc
from opledger.dev.processes import Proc, Stack, free_port, use_broker, wait_until
from opledger.ledger import Ledger, Status
from opledger.settings import Settings

from .common import Row
from .services import Services
from .workers import Workers

OWNER = "owner@acme.test"
CASE = "case-318"
KILLED = "exited with 'signal 9 (SIGKILL)'"
#: where a worker waits before its scenario (a queue of its own: `<this>.<name>`); only
#: the sweeps that warm it up are sent there
STANDBY_QUEUE = "opledger-demo.standby"
#: the queues a scenario's worker is switched onto. The agent's clean worker keeps the
#: maintenance queue (sweep, relay) throughout, so an armed worker runs only the tasks its
#: crash point is about.
SWITCHED = ("dispatch", "reconcile")
#: how often the demo looks at the ledger while it waits
POLL_S = 0.1


class Story:
    """The stack and the helpers each scenario uses."""

    AGENT = "agent-worker"

    def __init__(self, svc: Services, phase: Callable[[str], None]) -> None:
        self.svc = svc
        self.sandbox = svc.sandbox
        self.phase = phase
        self.run = uuid.uuid4().hex[:6]
        self.env = self._env()
        self.settings = Settings.from_environ(self.env)
        self.stack = Stack(self.env, svc.workdir, name="demo", proc=ForkedProc)  # the beat
        self.workers = Workers(self.env, svc.workdir, self.run)
        self.all_ops: list[str] = []
        self.armed: str | None = None
        self._crashes_before = 0
        self.flower: Flower | None = None
        self._ledger: Ledger | None = None

    def _env(self) -> dict[str, str]:
        svc = self.svc
        return stack_env(svc.database_url or "", svc.broker_url, svc.sandbox, svc.workdir)

    @property
    def ledger(self) -> Ledger:
        assert self._ledger is not None, "start the story first"
        return self._ledger

    def _refused_early(self) -> bool:
        """Whether the early worker's startup checks ran before the database was migrated
        (they refuse an unmigrated schema or an unreachable server: one line, exit 4).
        Waits until it is ready or has refused, so a refusal a moment later is not missed."""
        proc = self.workers.procs[self.AGENT]

        def refused() -> bool:
            said = proc.output()
            return proc.proc.poll() is not None or any(
                f"opledger worker: {check}:" in said for check in ("postgres", "schema")
            )

        wait_until(
            lambda: refused() or "ready." in proc.output(),
            90,
            "the agent's worker to start or refuse",
            every=POLL_S,
        )
        return refused()

    def start(self, *, flower: bool = False) -> None:
        """The agent's worker and beat (and Flower). The worker starts while Postgres is
        still starting when its address is known ahead (the embedded one's is)."""
        from opledger.tasks.app import app

        use_broker(app, self.svc.broker_url)
        early = self.svc.database_url is not None
        if early:
            self.workers.spawn(self.AGENT, active=True)
        if not self.svc.ready():  # somewhere else than expected: start it again, there
            self.env = self._env()
            self.stack.env = self.workers.env = self.env
            early = False
        elif early and self._refused_early():
            early = False  # it checked the database before the migration had committed
        self.phase("starting a Celery worker and beat")
        if not early:
            self.workers.spawn(self.AGENT, active=True)
        assert self.svc.database_url is not None
        self._ledger = Ledger.from_url(
            self.svc.database_url,
            actions=load_registry(self.settings),
            **self.settings.ledger_options(),
        )
        self.svc.cleanup.append(self._ledger.engine.dispose)
        configure_sandbox(self.sandbox, self.settings)
        self.ledger.grant(tenant="acme", scope=["*"], granted_by="demo", ref="auth_demo_agent")
        self.stack.start_beat()
        if flower:
            self.flower = Flower(self.env, self.svc.workdir)
            self.svc.cleanup.append(self.flower.proc.kill)
        # The workers of the later scenarios, started one by one while the first ones run.
        self.workers.plan("armed-before-call", OPLEDGER_CRASHPOINT="dispatch.before_call")
        self.workers.plan("armed-after-call", OPLEDGER_CRASHPOINT="dispatch.after_call")
        self.workers.plan("second-worker")
        self.workers.plan("armed-after-save", OPLEDGER_CRASHPOINT="dispatch.after_save")
        self.workers.wait_ready(self.AGENT)
        if self.flower is not None:
            self.phase("starting Flower")
            self.wait(self.flower.answers, 60, "Flower to answer")

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """`wait_until`, starting the next planned workers meanwhile."""

        def check() -> Any:
            self.workers.pump()
            return predicate()

        return wait_until(check, timeout, what, every=POLL_S)

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
            intent = dict(target=CASE, payload={"note": "Onboarding complete"})
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
        def one(op_id: str) -> bool:
            status = self.ledger.get(op_id).status  # one query; the history only if unknown
            if status is Status.UNKNOWN:
                return self.ledger.history(op_id).at_rest
            return status.final

        def done() -> bool:
            return all(one(op_id) for op_id in op_ids)

        self.wait(done, timeout, "the operations to settle")

    def arm(self, worker: str) -> None:
        """From now on only `worker` (started with a crash point armed) takes tasks."""
        self.workers.deactivate(self.AGENT)
        self.workers.activate(worker)
        self.armed = worker
        self._crashes_before = self.workers.crashes(worker)

    def disarm(self, *, again: bool = False) -> None:
        """The armed worker stops taking tasks (killed, unless it is needed `again`); the
        agent's clean worker takes over."""
        assert self.armed is not None
        if again:
            self.workers.deactivate(self.armed)
            # The process that died was replaced: two sweeps at once, so one reaches it.
            self.workers.warm(self.armed, 2)
        else:
            self.workers.kill(self.armed)
        self.armed = None
        self.workers.activate(self.AGENT)

    def crashes(self) -> int:
        """Worker processes killed at the armed crash point in this scenario."""
        assert self.armed is not None
        return self.workers.crashes(self.armed) - self._crashes_before

    def fresh_providers(self) -> None:
        """A clean CRM and mailbox for the next scenario (case-318 open again)."""
        self.sandbox.reset()
        configure_sandbox(self.sandbox, self.settings)

    def effect(self, op_id: str) -> str:
        """Where the sandbox counts `op_id`'s effect and requests (by its key)."""
        return effect_key(self.ledger.history(op_id))

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
            if h.open_review is not None:
                reviews.append(f"{label}: {h.open_review.reason}")
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


class Flower:
    """`opledger flower` on a loopback port, behind basic auth: the user's
    OPLEDGER_FLOWER_USER / OPLEDGER_FLOWER_PASSWORD when set, else a password made up for
    this run."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.port = free_port()
        self.user = os.environ.get("OPLEDGER_FLOWER_USER") or "opledger"
        configured = os.environ.get("OPLEDGER_FLOWER_PASSWORD")
        self.password = configured or secrets.token_urlsafe(12)
        self.credentials = (
            f"user {self.user}, password from your OPLEDGER_FLOWER_PASSWORD"
            if configured
            else f"user {self.user}, password {self.password} (made up for this run; "
            "set OPLEDGER_FLOWER_PASSWORD to choose it)"
        )
        self.url = f"http://127.0.0.1:{self.port}/"
        self.proc = Proc(
            "flower",
            ["flower", "--port", str(self.port), "--address", "127.0.0.1"],
            {**env, "OPLEDGER_FLOWER_USER": self.user, "OPLEDGER_FLOWER_PASSWORD": self.password},
            workdir / "flower.log",
        )

    def answers(self) -> bool:
        if self.proc.proc.poll() is not None:
            raise AssertionError(f"Flower died:\n{self.proc.output()[-3000:]}")
        try:
            response = httpx.get(f"{self.url}healthcheck", auth=(self.user, self.password))
        except httpx.HTTPError:
            return False
        return response.status_code == 200
