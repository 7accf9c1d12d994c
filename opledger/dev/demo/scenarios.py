"""The scenarios: the story, and the same story broken at each crash window."""

from __future__ import annotations

import signal

from opledger.dev.chaos.variants import KINDS
from opledger.ledger import IntentConflict
from opledger.queues import QUEUES

from .common import Row
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


def happy(story: Story) -> Row:
    close = story.prepare("happy", "close")
    email = story.prepare("happy", "email", action="email.send.v1")
    story.send(close, email)
    story.settle([close, email])
    return story.row("the story", "nothing", [close, email])


def crash_before_dispatch(story: Story) -> Row:
    story.arm("armed-before-call")
    close = story.prepare("before-dispatch", "close")
    story.send(close)
    story.wait(lambda: story.crashes() >= 1, 30, "the crash")
    story.disarm()
    replayed = story.prepare("before-dispatch", "close")  # the agent replays its step
    assert replayed == close, "a replayed step must not create a second intent"
    story.settle([close])
    return story.row(
        "2. crash before dispatch",
        "worker SIGKILLed after the claim, before the CRM call; the agent replayed its step "
        "(same operation came back)",
        [close],
    )


def response_dropped(story: Story) -> Row:
    story.arm("armed-after-call")
    close = story.prepare("response-dropped", "close")
    story.send(close)
    story.wait(lambda: story.crashes() >= 1, 30, "the crash")
    story.disarm(again=True)  # the same crash point is armed for scenario 4
    story.settle([close])
    return story.row(
        "3. CRM commits, response lost",
        "the CRM applied the close; the worker was SIGKILLed before saving the response; "
        "reconciled through the CRM's status API",
        [close],
    )


def receipt_lost(story: Story) -> Row:
    story.arm("armed-after-call")
    email = story.prepare("receipt-lost", "email", action="email.send.v1")
    smtp = story.prepare("receipt-lost", "email-smtp", action="email.smtp_send.v1")
    story.send(email, smtp)  # two pool processes: each dies after its provider answered

    def both_sent_and_crashed() -> bool:
        return story.crashes() >= 2 and all(story.ledger.history(o).attempts for o in (email, smtp))

    story.wait(both_sent_and_crashed, 30, "both crashes")
    story.disarm()
    story.settle([email, smtp])
    return story.row(
        "4. email accepted, receipt lost",
        "the provider accepted each email; the worker died before recording it. The API "
        "keeps keys (a same-key retry is safe); SMTP has no dedup and no lookup",
        [email, smtp],
    )


def two_workers(story: Story) -> Row:
    story.sandbox.configure(account="keyed-status", processing_s=0.8)
    close = story.prepare("two-workers", "close")
    story.send(close)
    story.wait(lambda: story.sandbox.truth()["requests"].get(story.effect(close)), 20, "the call")
    stalled = story.workers.procs[story.AGENT]
    stalled.signal(signal.SIGSTOP)
    try:
        story.workers.activate("second-worker", QUEUES)  # the sweeper's queue too
        story.wait(lambda: story.ledger.get(close).status.final, 30, "the second worker")
    finally:
        stalled.signal(signal.SIGCONT)
    story.wait(
        lambda: any(
            e.source == "dispatch" and not e.applied for e in story.ledger.history(close).evidence
        ),
        20,
        "the stalled worker's late answer",
    )
    story.workers.kill("second-worker")
    story.sandbox.configure(account="keyed-status", processing_s=0.0)
    return story.row(
        "5. two workers, lease expired",
        "worker SIGSTOPped mid-call past its lease; a second worker reconciled; the first "
        "woke up and its late answer was refused by the fence (kept as evidence)",
        [close],
    )


def unsafe_retries(story: Story) -> Row:
    close = story.prepare("unsafe", "close", payload={"note": "first"})
    try:
        story.prepare("unsafe", "close", payload={"note": "changed"})
        conflict = "accepted (wrong!)"
    except IntentConflict:
        conflict = "refused: IntentConflict"
    story.send(close)
    search = next(k for k in KINDS if k.name == "search")
    story.sandbox.configure(account=search.account, search_lag_s=120.0)
    lagging = story.prepare("unsafe", "close-lagging", action=search.action)
    story.sandbox.fault("crm", "drop_after_commit", key=story.ledger.get(lagging).idempotency_key)
    story.send(lagging)
    story.settle([close, lagging])
    return story.row(
        "1. changed payload, lagging search",
        f"the agent re-sent the close with a changed payload ({conflict}); a CRM without keys "
        "lost a response and its search lags far behind: absence proves nothing",
        [close, lagging],
    )


def after_save(story: Story) -> Row:
    story.arm("armed-after-save")
    close = story.prepare("after-save", "close")
    email = story.prepare("after-save", "email", action="email.send.v1")
    story.send(close, email)
    story.wait(lambda: story.crashes() >= 2, 30, "the crashes")
    story.disarm()
    story.settle([close, email])
    return story.row(
        "+ crash after save, before ack",
        "worker SIGKILLed after each outcome was saved, before the broker ack",
        [close, email],
    )


def redis_restart(story: Story) -> Row | None:
    if story.svc.redis is None:
        return None  # a configured broker is not ours to restart
    # No worker takes the messages: they stay queued. The agent's worker stops taking any
    # (the sweeps too) and finishes what it holds first; see `Workers.wait_idle`.
    story.workers.deactivate(story.AGENT, QUEUES)
    story.workers.wait_idle(story.AGENT)
    close = story.prepare("redis", "close")
    email = story.prepare("redis", "email", action="email.send.v1")
    story.send(close, email)
    story.svc.redis.restart()
    story.workers.activate(story.AGENT, QUEUES)  # once it has reconnected
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
    story.wait(lambda: story.sandbox.truth()["requests"].get(story.effect(close)), 20, "the call")
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
    unsafe_retries,  # first: its worker runs already, and the next one starts meanwhile
    crash_before_dispatch,
    response_dropped,
    receipt_lost,
    two_workers,
    after_save,
    redis_restart,
    postgres_restart,
)
TITLES = {
    happy: "the story",
    crash_before_dispatch: "crash before dispatch",
    response_dropped: "CRM commits, response lost",
    receipt_lost: "email accepted, receipt lost",
    two_workers: "two workers, lease expired",
    unsafe_retries: "changed payload, lagging search",
    after_save: "crash after save, before ack",
    redis_restart: "Redis restarted",
    postgres_restart: "Postgres restarted",
}
