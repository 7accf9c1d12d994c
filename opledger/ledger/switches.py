"""The ledger is a checkpoint too: noticing when it went back, and what it does then.

A failover to an asynchronous standby that was behind, or a restore, gives the ledger an
earlier state than the one workers acted on. The ledger is evidence of what opledger saved,
not a receipt from the world, so after such a switch it finds out and says so:

- every claim and outcome statement checks the database against what this process saw of
  it (`opledger.ledger.epochs`); one that finds another timeline, an older epoch or its WAL
  behind what was durable writes nothing, and the switch is recorded first
  (`opledger_switch`: a new epoch, with its fence floor and suspicion window);
- every operation still open is quarantined (`opledger_quarantine`): `unknown`, its fence
  raised to the floor (no fence is ever issued twice), with one attempt more, the one the
  ledger may have forgotten; the retry decision reads it like any attempt whose outcome is
  unknown, so the provider's evidence decides (a lookup by the key, which is derived from
  the intent and so the one the provider saw; a same-key retry it deduplicates), else a
  person, shown the switch;
- an operation prepared before the suspicion window ended is quarantined on its first
  claim instead of being sent: it may be an act asked again whose first record was lost;
- a provider's answer to a claim the ledger no longer knows is kept as an orphan receipt,
  and becomes its operation's evidence once the operation is known or asked again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import AwareDatetime
from sqlalchemy import TextClause
from sqlalchemy.exc import DBAPIError

from . import queries as q
from . import store
from .base import LedgerBase
from .bounds import Bounds, lost_cycle
from .errors import DatabaseUnavailable, InvalidInput, Quarantined
from .ids import check_identifier
from .models import Binding, Claim, ClaimTerms, Record
from .queries.maintenance import BOUND_TRANSACTION

log = logging.getLogger("opledger.ledger")

#: how long after a switch an operation prepared is not first-dispatched blind (an agent
#: asking again for an act whose record the switch took back does so within it)
DEFAULT_SUSPECT_WINDOW = timedelta(hours=1)

#: the detector named when no process says who it is
DETECTOR = "ledger-switch"

#: how often a statement that found the ledger switched is run again once the switch is
#: recorded (another switch in between is the only reason for a second time)
SWITCH_RETRIES = 3


class LedgerEpoch(Record):
    """One epoch of the ledger: where it ran from `began_at` on."""

    epoch: int
    #: "initial" (the database the ledger was migrated on), "timeline" (the server writes
    #: on another timeline: a promotion, a point-in-time restore) or "rewind" (the ledger
    #: was behind what a process had seen of it: a restore, a standby that was behind)
    kind: Literal["initial", "timeline", "rewind"]
    timeline: int | None
    previous_timeline: int | None = None
    began_at: AwareDatetime
    #: the server's WAL position when it was recorded, and the one the detector had seen
    lsn: str | None = None
    seen_lsn: str | None = None
    detected_by: str
    reason: str
    #: every operation open at the switch had its fence raised to at least this
    fence_floor: int = 0
    #: how many operations were quarantined when it was recorded
    quarantined: int = 0
    #: operations prepared before this are not first-dispatched blind
    suspect_until: AwareDatetime | None = None
    #: the operator who ended the suspicion window early, if one did
    ended_by: str | None = None

    @property
    def is_switch(self) -> bool:
        return self.kind != "initial"


class OrphanReceipt(Record):
    """A provider's answer to a claim the ledger had no record of, kept."""

    id: int
    received_at: AwareDatetime
    op_id: str
    tenant: str
    workflow_id: str
    intent_key: str
    action: str
    target: str
    payload_digest: str
    idempotency_key: str
    fence: int
    attempt_n: int | None = None
    #: the epoch the claim was issued in, and the ledger's when its answer came
    claim_epoch: int | None = None
    ledger_epoch: int | None = None
    #: True when the claim was the ledger's, issued in an earlier epoch (a switch forgot
    #: it); False for a claim the ledger never issued in its current epoch (forged or
    #: confused), kept for a person and never used as evidence
    forgotten: bool
    why: str
    reported_by: str
    verdict: str
    binding: dict[str, Any]
    detail: dict[str, Any]
    #: the operation it was tied to as evidence, once known
    matched_op_id: str | None = None
    matched_at: datetime | None = None


class Replication(Record):
    """What a failover of the ledger's database could lose, as the ledger's session sees it."""

    synchronous_commit: str
    synchronous_standby_names: str
    in_recovery: bool
    #: the standbys the server streams to: name, state and sync_state (None where the
    #: role may not see it: grant it pg_monitor)
    standbys: tuple[dict[str, Any], ...]

    @property
    def sync_standbys(self) -> int:
        return sum(1 for s in self.standbys if s.get("sync_state") in ("sync", "quorum"))

    @property
    def waits_for_standby(self) -> bool:
        """Whether this session's commits wait for a synchronous standby."""
        return bool(self.synchronous_standby_names.strip()) and self.synchronous_commit in (
            "on",
            "remote_write",
            "remote_apply",
        )

    @property
    def kind(self) -> Literal["synchronous", "asynchronous", "none", "unknown"]:
        """ "synchronous": every commit waits for a standby that is attached; "asynchronous":
        standbys stream, but a commit does not wait for one; "none": no standby streams;
        "unknown": standbys stream but the role may not see their sync state."""
        if self.waits_for_standby and self.sync_standbys > 0:
            return "synchronous"
        if not self.standbys:
            return "none"
        if self.waits_for_standby and any(s.get("sync_state") is None for s in self.standbys):
            return "unknown"
        return "asynchronous"

    @property
    def durable_on_failover(self) -> bool:
        """Whether a committed claim or outcome survives a failover to a standby."""
        return self.kind == "synchronous"

    def summary(self) -> str:
        """One line for `opledger check` and the logs."""
        n = len(self.standbys)
        if self.kind == "synchronous":
            return (
                f"synchronous: commits wait for {self.sync_standbys} of {n} standby(s) "
                f"(synchronous_commit={self.synchronous_commit}, synchronous_standby_names="
                f"{self.synchronous_standby_names!r}); a failover to one of them loses nothing"
            )
        if self.kind == "none":
            return (
                "no standby streams from this server: a failover is a restore, and work "
                "committed since the backup is lost (opledger notices and reconciles it)"
            )
        if self.kind == "unknown":
            return (
                f"{n} standby(s) stream, but this role may not see whether one is synchronous "
                "(grant it pg_monitor to know)"
            )
        return (
            f"asynchronous: {n} standby(s) stream, but commits do not wait for them "
            f"(synchronous_commit={self.synchronous_commit}, synchronous_standby_names="
            f"{self.synchronous_standby_names!r}); a failover can lose committed claims and "
            "outcomes (opledger notices and reconciles them from provider evidence)"
        )


def holds_of(terms: ClaimTerms | None, send_window: timedelta) -> tuple[str, timedelta]:
    """How long after now an attempt the ledger forgot may still be in flight: per provider
    (JSON, seconds) and by default; a claim's send window and its in-flight time, as the
    claim statement measures them."""
    terms = terms or ClaimTerms()
    window = terms.send_window or send_window
    in_flight = terms.in_flight or terms.lease
    providers = set(terms.send_window_by_provider) | set(terms.in_flight_by_provider)
    per = {
        p: (
            terms.send_window_by_provider.get(p, window)
            + terms.in_flight_by_provider.get(p, in_flight)
        ).total_seconds()
        for p in sorted(providers)
    }
    return store.to_json(per), window + in_flight


class Switches(LedgerBase):
    """Noticing a switch of the ledger's database, and the records it leaves."""

    #: operations prepared up to this long after a switch are not first-dispatched blind
    suspect_window: timedelta = DEFAULT_SUSPECT_WINDOW
    #: every claim of the fleet waits for a synchronous standby (strict mode,
    #: `OPLEDGER_REQUIRE_SYNC_STANDBY`): a promotion then lost nothing, and quarantines
    #: nothing (a restore still does)
    claims_synchronous: bool = False

    # -- what the hot statements check --------------------------------------------------

    def _seen(self) -> dict[str, Any]:
        """The parameters every claim and outcome statement checks the ledger against."""
        witness = self._store.witness
        if witness.wal is None:
            self._probe_wal()
        return witness.params()

    def _probe_wal(self) -> None:
        witness = self._store.witness
        try:
            # on a kept connection, as the claims and outcomes that ask for it
            row = self._store.hot(q.PROBE_WAL, {})
            assert row is not None
        except DatabaseUnavailable:
            raise
        except Exception as exc:  # a server that refuses to say (a managed service)
            log.warning(
                "the ledger's database does not let its timeline and WAL position be read "
                "(%s): a failover or a restore cannot be noticed",
                str(exc).splitlines()[0][:200],
            )
            witness.probed(False)
            return
        witness.probed(True, row[0], row[1])

    def _checked(
        self,
        statement: TextClause,
        params: Mapping[str, Any],
        *,
        by: str,
        terms: ClaimTerms | None,
        what: str,
    ) -> tuple[tuple[Any, ...], int]:
        """Run a claim or outcome statement, whose row ends with `opledger_epoch_check`'s
        four columns, until it finds the ledger as this process saw it: where it went back
        the statement wrote nothing, and the switch is recorded (`check_switch`) before it
        runs again. Its row without those columns, and the epoch it ran in."""
        for _ in range(SWITCH_RETRIES):
            row = self._store.hot(statement, {**params, **self._seen()})
            assert row is not None  # the statement always returns its one row
            epoch, timeline, flushed, fresh = row[-4:]
            if fresh:
                self._store.witness.saw(epoch, timeline, flushed)
                return row[:-4], epoch
            if self.check_switch(by=by, terms=terms) is None:  # pragma: no cover
                raise DatabaseUnavailable("the ledger's epoch could not be checked")
        raise DatabaseUnavailable(f"the ledger kept switching while {what}")

    def check_switch(
        self,
        *,
        by: str = DETECTOR,
        terms: ClaimTerms | None = None,
        interval: timedelta | None = None,
    ) -> LedgerEpoch | None:
        """Whether the ledger's database went back since this process last saw it: another
        timeline, an older epoch, its WAL behind what was durable. If so, the switch is
        recorded once, whichever process notices it first, and every open operation is
        quarantined (the module's docstring says how). Returns the newest epoch (None where
        the server does not let its WAL position be read). The beat asks it before every
        sweep; claims and outcomes ask it in their own statement. `interval`: the sweep's,
        which bounds its transaction as every maintenance transaction is (`Bounds`): a
        sweep frozen inside it holds the epochs' lock no longer, and one the server ended
        returns None (the next sweep checks again)."""
        witness = self._store.witness
        if witness.wal is None:
            self._probe_wal()
        if not witness.wal:
            return None
        check_identifier("by", by)
        holds, hold = holds_of(terms, self.send_window)
        params = witness.params()
        bounds = Bounds.of(interval)
        started = time.monotonic()
        try:
            row = self._record_switch(by, params, holds, hold, bounds if interval else None)
        except (DBAPIError, DatabaseUnavailable) as exc:
            took = timedelta(seconds=time.monotonic() - started)
            why = lost_cycle(exc, took=took, bounds=bounds) if interval else None
            if why is None:
                raise
            log.warning("the switch check lost its cycle: its transaction %s", why)
            return None
        epoch = store.record(LedgerEpoch, row)
        witness.adopt(epoch.epoch, epoch.timeline, row.flushed)
        if row.made or (epoch.is_switch and epoch.epoch > params["seen_epoch"] >= 0):
            self._announce(epoch, made=bool(row.made))
        return epoch

    def _record_switch(
        self,
        by: str,
        params: Mapping[str, Any],
        holds: Any,
        hold: Any,
        bounds: Bounds | None,
    ) -> Any:
        """`RECORD_SWITCH`'s row, in a transaction of its own (bounded by `bounds`)."""
        with self._tx() as conn:
            if bounds is not None:
                conn.execute(BOUND_TRANSACTION, bounds.params())
            return conn.execute(
                q.RECORD_SWITCH,
                {
                    "by": by,
                    "seen_epoch": params["seen_epoch"] if params["seen_epoch"] >= 0 else None,
                    "seen_timeline": params["seen_timeline"],
                    "seen_lsn": params["seen_lsn"] if params["seen_epoch"] >= 0 else None,
                    "holds": holds,
                    "hold": hold,
                    "suspect": self.suspect_window,
                    "lossless": self.claims_synchronous,
                },
            ).one()

    def _announce(self, epoch: LedgerEpoch, *, made: bool) -> None:
        if made:
            log.error(
                "ledger switch #%d recorded: %s. %d open operation(s) quarantined: their "
                "providers' evidence decides what happened, else a person; operations "
                "prepared until %s are not sent blind",
                epoch.epoch,
                epoch.reason,
                epoch.quarantined,
                epoch.suspect_until.isoformat(timespec="seconds") if epoch.suspect_until else "-",
                extra={"epoch": epoch.epoch, "switch": epoch.kind},
            )
        else:
            log.warning(
                "the ledger is in epoch %d since a switch (%s), recorded by %s",
                epoch.epoch,
                epoch.reason,
                epoch.detected_by,
                extra={"epoch": epoch.epoch},
            )

    def _quarantine(self, op_id: str, by: str, terms: ClaimTerms | None) -> Quarantined:
        """Quarantine one prepared operation its claim found suspect; the error to raise."""
        holds, hold = holds_of(terms, self.send_window)
        with self._tx() as conn:
            conn.execute(q.QUARANTINE_ONE, {"op_id": op_id, "by": by, "holds": holds, "hold": hold})
        log.warning(
            "%s was not sent: it was prepared while the ledger may have forgotten an earlier "
            "ask of its act (a switch); it is unknown until its provider's evidence decides",
            op_id,
            extra={"op_id": op_id},
        )
        return Quarantined(
            f"{op_id} was quarantined instead of claimed: the ledger may have forgotten an "
            "earlier ask or attempt of its act",
            op_id=op_id,
        )

    def _keep_orphan(
        self,
        claim: Claim,
        *,
        verdict: str,
        binding: Binding,
        detail: str,
        forgotten: bool,
        why: str,
    ) -> tuple[int, str | None, str | None]:
        """Keep a provider's answer to a claim the ledger has no record of: the orphan
        receipt's id, and the operation it was tied to as evidence (and its status)."""
        op = claim.operation
        with self._tx() as conn:
            row = conn.execute(
                q.INSERT_ORPHAN,
                {
                    "op_id": op.id,
                    "tenant": op.tenant,
                    "workflow_id": op.workflow_id,
                    "intent_key": op.intent_key,
                    "action": op.action,
                    "target": op.target,
                    "payload_digest": op.payload_digest,
                    "idempotency_key": claim.idempotency_key,
                    "fence": claim.fence,
                    "attempt_n": claim.attempt_n,
                    "claim_epoch": claim.epoch,
                    "forgotten": forgotten,
                    "why": why,
                    "reported_by": claim.owner,
                    "verdict": verdict,
                    "binding": binding.model_dump_json(exclude_none=True),
                    "detail": detail,
                },
            ).one()
        return int(row.id), row.tied_to, row.status

    # -- reads and an operator's word ----------------------------------------------------

    def epochs(self, *, limit: int = 20) -> tuple[LedgerEpoch, ...]:
        """The ledger's epochs, newest first: the database it was made on, then each switch."""
        with self._single() as conn:
            rows = conn.execute(q.LIST_EPOCHS, {"limit": limit}).all()
        return tuple(store.record(LedgerEpoch, r) for r in rows)

    def end_suspicion(self, epoch: int, *, by: str) -> LedgerEpoch:
        """End switch `epoch`'s suspicion window now: operations prepared from now on are
        first-dispatched as usual (those prepared before stay suspect). An operator's word
        that agents have asked again for what they had asked before the switch."""
        check_identifier("by", by)
        with self._tx() as conn:
            row = conn.execute(q.END_SUSPICION, {"epoch": epoch, "by": by}).one_or_none()
        if row is None:
            raise InvalidInput(f"no switch #{epoch} (epoch 0 is no switch)", field="epoch")
        log.warning("%s ended the suspicion window of ledger switch #%d", by, epoch)
        return store.record(LedgerEpoch, row)

    def orphan_receipts(
        self, *, unmatched: bool = False, tenant: str | None = None, limit: int = 50
    ) -> tuple[OrphanReceipt, ...]:
        """Providers' answers to claims the ledger had no record of, newest first."""
        with self._single() as conn:
            rows = conn.execute(
                q.LIST_ORPHANS, {"unmatched": unmatched, "tenant": tenant, "limit": limit}
            ).all()
        return tuple(store.record(OrphanReceipt, r) for r in rows)

    def replication(self) -> Replication:
        """What a failover of the ledger's database could lose, as the ledger's own session
        commits: its synchronous_commit, the server's synchronous_standby_names and the
        standbys attached."""
        with self._single() as conn:
            row = conn.execute(q.REPLICATION).one()
        return Replication(
            synchronous_commit=row.synchronous_commit,
            synchronous_standby_names=row.synchronous_standby_names,
            in_recovery=row.in_recovery,
            standbys=tuple(row.standbys or ()),
        )
