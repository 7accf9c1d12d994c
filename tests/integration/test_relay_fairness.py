"""The relay's budget is shared by the providers: a provider with a backlog of due
operations takes no more of one run than its turn, so another provider's few are published
in the same run, interleaved; and an operation deferred for its provider's room is not
published before its time, whatever the budget left. Against the real Postgres."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from opledger.ledger import Ledger
from tests.intents import prepare

HOUR = timedelta(hours=1)


def due(ledger: Ledger, key: str, action: str) -> str:
    """A prepared operation deferred for its provider's room, due now."""
    op_id = prepare(ledger, key, action=action)
    assert ledger.defer(op_id, until=datetime.now(UTC) - timedelta(seconds=1))
    return op_id


def test_one_providers_backlog_never_takes_another_providers_turn(
    ledger: Ledger, grant: str
) -> None:
    busy = [due(ledger, f"crm-{i}", "crm.close_case.v1") for i in range(30)]  # the oldest
    quiet = [due(ledger, f"mail-{i}", "email.send.v1") for i in range(3)]
    published: list[str] = []
    ledger.relay(older_than=HOUR, publish=lambda op_id, _g: published.append(op_id), limit=8)
    # each provider's oldest first, in turns: the three of the quiet one are in this run,
    # interleaved with the busy one's, which fills the rest of the budget
    assert published == [busy[0], quiet[0], busy[1], quiet[1], busy[2], quiet[2], *busy[3:5]]
    rest: list[str] = []
    ledger.relay(older_than=HOUR, publish=lambda op_id, _g: rest.append(op_id), limit=100)
    assert rest == busy[5:]  # nothing published twice, nothing left behind


def test_an_operation_waiting_for_room_is_not_published_before_its_time(
    ledger: Ledger, grant: str
) -> None:
    later = prepare(ledger, "later")
    assert ledger.defer(later, until=datetime.now(UTC) + HOUR)
    now = due(ledger, "now", "crm.close_case.v1")
    published: list[str] = []
    ledger.relay(older_than=HOUR, publish=lambda op_id, _g: published.append(op_id), limit=10)
    assert published == [now]
    assert ledger.get(later).next_check_at is not None  # still waiting, still deferred
