"""What the demo's parts share: its constants and the row a scenario reports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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

#: phase text, scenarios done, scenarios in this run
Phase = Callable[[str, int, int], None]


@dataclass
class Row:
    scenario: str
    broken: str
    outcome: str
    effects: str
    review: str
