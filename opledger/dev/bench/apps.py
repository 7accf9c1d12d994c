"""What the bench's workers run: bare Celery's no-op task, and the instant adapter
opledger's operations are dispatched to (no network)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from celery import Celery

from opledger.adapters.base import Contract, Idempotency, Lookup, LookupResult
from opledger.adapters.registry import Registry
from opledger.ledger import Attempt, Binding, Claim, Confirmed, Operation, Outcome
from opledger.settings import Settings

ACTION = "bench.noop.v1"


class InstantAdapter:
    """Confirms at once, without any network: the ledger's own cost, nothing else."""

    actions: tuple[str, ...] = (ACTION,)
    contract = Contract(
        provider="bench",
        idempotency=Idempotency(kind="keyed", scope="bench", retention=timedelta(days=1)),
        lookup=Lookup(kind="none"),
        request_timeout=timedelta(seconds=1),
        max_in_flight=timedelta(seconds=2),
        source="benchmark adapter: no provider at all",
    )

    def dispatch(self, claim: Claim) -> Outcome:
        return Confirmed(
            receipt_id=claim.idempotency_key, binding=Binding(idempotency_key=claim.idempotency_key)
        )

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        return LookupResult(verdict="inconclusive")


def build_registry(settings: Settings) -> Registry:
    return Registry([InstantAdapter()])


# A bare Celery app with opledger's worker settings and one no-op task carrying an id. Not
# made the current app: importing the bench (its CLI, a test) must not rebind opledger's
# shared tasks to it (`celery -A ...:bare worker` makes it current in its own process).
bare = Celery("opledger-bench", set_as_current=False)
bare.config_from_object("opledger.celeryconfig")
bare.conf.beat_schedule = {}


@bare.task(name="bench.noop")
def noop(op_id: str) -> None:
    counter = bare_counter()
    if counter.incr("bench:done") >= _bare_total():  # the last one notes when it ended
        counter.set("bench:end", repr(time.time()))


_counter: Any = None
_total: int | None = None


def bare_counter() -> Any:
    global _counter
    if _counter is None:
        import redis

        _counter = redis.Redis.from_url(bare.conf.broker_url)
    return _counter


def _bare_total() -> int:
    global _total
    if _total is None:
        _total = int(bare_counter().get("bench:total") or 0)
    return _total
