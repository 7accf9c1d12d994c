"""The pure parts of noticing a ledger switch: keys derived from the intent, what one
process remembers of the database (`Witness`), what a replication setup can lose, and how
long an attempt the ledger forgot may still be in flight."""

from __future__ import annotations

import json
import re
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from opledger.ledger import ClaimTerms, Replication
from opledger.ledger.epochs import Witness, lsn_number, lsn_text
from opledger.ledger.ids import LONGEST_KEY, intent_idempotency_key, new_key_for
from opledger.ledger.switches import holds_of

KEY = re.compile(r"opk_[0-9A-HJKMNP-TV-Z]{26}")
names = st.text(min_size=1, max_size=40)


@given(names, names, names, names, names)
def test_a_key_is_a_digest_of_the_intent_and_nothing_else(
    namespace: str, tenant: str, run: str, action: str, intent: str
) -> None:
    key = intent_idempotency_key(
        namespace, tenant=tenant, workflow_id=run, action=action, intent_key=intent
    )
    assert KEY.fullmatch(key) and len(key) <= LONGEST_KEY
    again = intent_idempotency_key(
        namespace, tenant=tenant, workflow_id=run, action=action, intent_key=intent
    )
    assert again == key
    assert len(new_key_for(key, 999)) <= LONGEST_KEY
    assert new_key_for(new_key_for(key, 2), 3) == f"{key}.k3"


@given(st.lists(st.tuples(names, names, names, names), min_size=2, max_size=20, unique=True))
def test_different_intents_never_share_a_key(intents: list[tuple[str, str, str, str]]) -> None:
    keys = {
        intent_idempotency_key("ns", tenant=t, workflow_id=w, action=a, intent_key=i)
        for t, w, a, i in intents
    }
    assert len(keys) == len(intents)


def test_where_one_field_ends_and_the_next_begins_matters() -> None:
    one = intent_idempotency_key("ns", tenant="ab", workflow_id="c", action="x", intent_key="y")
    two = intent_idempotency_key("ns", tenant="a", workflow_id="bc", action="x", intent_key="y")
    assert one != two


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_a_wal_position_reads_back(number: int) -> None:
    assert lsn_number(lsn_text(number)) == number


def test_a_witness_keeps_the_furthest_position_of_one_timeline() -> None:
    witness = Witness()
    assert witness.params()["seen_epoch"] == -1 and witness.params()["wal"] is False
    witness.saw(0, 1, "0/100")
    witness.saw(0, 1, "0/80")  # an older answer, read on another connection
    assert witness.flushed == 0x100
    witness.saw(0, 2, "0/10")  # another timeline: started over
    assert (witness.timeline, witness.flushed) == (2, 0x10)
    witness.saw(3, 2, "0/20")  # a newer epoch another process recorded
    assert (witness.epoch, witness.flushed) == (3, 0x20)
    witness.saw(None, 5, "0/99")  # no epoch read: nothing learned
    assert witness.timeline == 2
    witness.adopt(4, 2, "0/5")  # after a switch: what is, not the furthest
    assert (witness.epoch, witness.flushed) == (4, 5)
    assert witness.params()["seen_lsn"] == "0/5"


def replication(commit: str, names: str, *states: str | None) -> Replication:
    return Replication(
        synchronous_commit=commit,
        synchronous_standby_names=names,
        in_recovery=False,
        standbys=tuple(
            {"name": f"s{i}", "state": "streaming", "sync_state": s} for i, s in enumerate(states)
        ),
    )


def test_what_a_failover_can_lose() -> None:
    assert replication("on", "*", "sync").kind == "synchronous"
    assert replication("remote_apply", "ANY 1 (a, b)", "quorum", "quorum").durable_on_failover
    assert replication("on", "", "async").kind == "asynchronous"
    assert replication("local", "*", "sync").kind == "asynchronous"  # this session waits for none
    assert replication("off", "*", "sync").kind == "asynchronous"
    assert replication("on", "*", "potential").kind == "asynchronous"
    assert replication("on", "*").kind == "none"
    assert replication("on", "*", None).kind == "unknown"  # the role may not see sync_state
    assert "pg_monitor" in replication("on", "*", None).summary()
    assert "loses nothing" in replication("on", "*", "sync").summary()
    assert "can lose" in replication("on", "", "async").summary()


def test_a_forgotten_attempt_may_be_in_flight_as_long_as_a_claim_allows() -> None:
    terms = ClaimTerms(
        lease=timedelta(seconds=60),
        in_flight=timedelta(seconds=20),
        send_window_by_provider={"crm": timedelta(seconds=5)},
        in_flight_by_provider={"smtp": timedelta(seconds=600)},
    )
    per, default = holds_of(terms, timedelta(seconds=10))
    assert json.loads(per) == {"crm": 25.0, "smtp": 610.0}
    assert default == timedelta(seconds=30)
    _, bare = holds_of(None, timedelta(seconds=10))
    assert bare == timedelta(seconds=70)  # the send window and the lease
