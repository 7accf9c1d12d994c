"""`opledger demo`: the onboarding story, then the same story broken at every crash window.

An agent closes case-318 in the CRM and emails the account owner: two operations. The
demo runs that story on real parts (Postgres, Redis, Celery workers and beat, sandbox
providers over HTTP and SMTP), then breaks it at each crash window (docs/crash-testing.md)
— killing worker processes for real — and shows, per scenario, what was broken, how each operation
ended, how many times the provider applied it, and whether a person was asked to decide.

Without OPLEDGER_DATABASE_URL / OPLEDGER_BROKER_URL it starts an embedded Postgres and an
embedded Redis of its own.

Where the time goes, and how it is kept short (about 35 s instead of 80-130 s on two busy
cores): starting a Celery worker costs two to three seconds of CPU, its pool processes
about one more each at their first task, and every crash scenario needs a worker armed
with its crash point and then a clean one. So the armed workers (and the second worker of
scenario 5) are started once, one after the other in the background at a lower CPU
priority, each on a standby queue of its own, where a couple of sweeps warm its pool
processes up; when its scenario comes, Celery's remote control switches it onto the
dispatch and reconcile queues (and off again) in milliseconds. The agent's clean worker
keeps consuming throughout; it is switched off while an armed one works. The first worker
starts while Postgres is still being initialised (without fsync: a throwaway cluster), and
the scenario with no crash runs first, while the next worker starts. Nothing is slept: the
demo polls the ledger and the workers' logs every 0.1 s.

Files: one temporary work directory (logs, beat's schedule, the processes' own temporary
files) and one for the embedded Postgres (data, socket, lock; in /dev/shm when there is
room, so removing it never waits on the disk), both removed at the end, also on Ctrl-C or
SIGTERM; only a successful `--keep` run leaves them, with the stack running.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opledger.dev.chaos.audit import Audit, audit

from .common import Phase, Row
from .scenarios import SCENARIOS, TITLES
from .services import Services, services
from .story import Story

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


def planned_scenarios() -> int:
    """How many scenarios this run shows: Redis and Postgres are only restarted when ours."""
    skipped = sum(bool(os.environ.get(v)) for v in ("OPLEDGER_BROKER_URL", "OPLEDGER_DATABASE_URL"))
    return len(SCENARIOS) - skipped


def run_demo(
    *, keep: bool, on_row: Callable[[Row], None], on_phase: Phase | None = None
) -> dict[str, Any]:
    """Run every scenario; returns the audit of all operations (and URLs with keep).

    `on_phase` hears what is going on (and how many scenarios are done) from the start."""
    total = planned_scenarios()
    done = [0]

    def phase(text: str) -> None:
        if on_phase is not None:
            on_phase(text, done[0], total)

    started = time.monotonic()
    with services(keep, phase) as svc:
        story = Story(svc, phase)
        svc.cleanup.append(story.stack.stop_all)
        svc.cleanup.append(story.workers.stop_all)
        rows: list[Row] = []
        try:
            story.start(flower=keep)
            totals = Audit()
            for scenario in SCENARIOS:
                phase(f"scenario {done[0] + 1}/{total}: {TITLES[scenario]}")
                story.fresh_providers()
                before = len(story.all_ops)
                row = scenario(story)
                if row is None:
                    continue
                done[0] += 1
                rows.append(row)
                on_row(row)
                part = audit(story.ledger, svc.sandbox.truth(), story.all_ops[before:])
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
        except Exception:
            _show_logs(svc.workdir)  # they go with the work directory
            raise
        summary: dict[str, Any] = {key: value for key, value in totals.as_dict().items()}
        summary["elapsed_s"] = round(time.monotonic() - started, 1)
        summary["rows"] = [dataclasses.asdict(row) for row in rows]
        summary["dirs"] = [str(d) for d in (svc.workdir, svc.rundir) if d is not None]
        if keep:
            summary["urls"] = _keep(story, svc)
        else:
            phase("stopping every process, removing every file")
        return summary


def _show_logs(workdir: Path, lines: int = 25) -> None:
    """The end of every process's log, on stderr: the run failed, and its work directory
    is about to be removed."""
    for log in sorted(workdir.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        print(f"--- the end of {log.name} ---", *tail, sep="\n", file=sys.stderr)


def _keep(story: Story, svc: Services) -> dict[str, str]:
    """Leave everything running; what to open, and the command that stops it all."""
    assert story.flower is not None
    svc.kept = True
    story.ledger.engine.dispose()
    # Workers, beat, Flower and Redis run in process groups of their own.
    groups = [p.proc.pid for p in story.workers.procs.values()] + [story.flower.proc.proc.pid]
    if story.stack.beat is not None:
        groups.append(story.stack.beat.proc.pid)
    if svc.redis is not None and svc.redis.proc is not None:
        groups.append(svc.redis.proc.pid)
    pids = [str(svc.sandbox.detach())]
    if svc.postgres is not None:
        pids.append(str(svc.postgres.pid()))  # SIGTERM: a clean shutdown
    dirs = [str(svc.workdir)] + ([str(svc.rundir)] if svc.rundir is not None else [])
    return {
        "flower": f"{story.flower.url} ({story.flower.credentials})",
        "sandbox": svc.sandbox.http_url,
        "sandbox_truth": f"{svc.sandbox.http_url}/_admin/truth",
        "database": str(svc.database_url),
        "broker": svc.broker_url,
        "logs": str(svc.workdir),
        "stop": "kill -- " + " ".join([f"-{pid}" for pid in groups] + pids),
        "then remove": "rm -rf " + " ".join(dirs),
    }
