"""The fenced claim and the outcome it records: the worker's two round trips."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, NoReturn

from pydantic import ValidationError
from sqlalchemy import Connection

from . import queries as q
from . import store
from .contract import Limits
from .errors import (
    AuthorizationRevoked,
    ClaimForgotten,
    ForbiddenTransition,
    ForgedFence,
    InvalidInput,
    OperationNotFound,
    ProviderBusy,
    StaleFence,
)
from .evidence import POSSIBLE_DUPLICATE, admit, replayed_answer
from .ids import (
    check_identifier,
    check_operation_id,
)
from .models import (
    Ambiguous,
    Answer,
    Binding,
    Claim,
    ClaimTerms,
    Confirmed,
    EvidenceSource,
    Operation,
    Outcome,
    Rejected,
    Status,
)
from .payload_keys import PayloadKeys, payload_text, seal_result
from .pressure import pressure_of
from .switches import Switches
from .window import SendWindow, clock

DEFAULT_LEASE = timedelta(seconds=60)

log = logging.getLogger("opledger.ledger")


class Claims(Switches):
    """The worker's path: `claim` (fence + 1, lease, attempt row) and `record_outcome`,
    each one autocommitted statement."""

    def claim(
        self,
        op_id: str,
        *,
        owner: str,
        terms: ClaimTerms | None = None,
        lease: timedelta | None = None,
    ) -> Claim | None:
        """Take a fenced claim on a prepared operation (its first dispatch), or None.

        One statement, committed before returning: the fence grows by one, the lease is
        set, the attempt row (with its in-flight deadline) is written and the frozen
        payload comes back. `terms` say how long the lease holds (`lease` overrides it),
        how long the request may take to start (the provider's send window) and how long
        it may still execute at the provider (its in-flight time); see `ClaimTerms`.

        The claim is good for *starting* the request only until `claim.send_by`; the
        attempt's in-flight deadline counts from `send_by`, and `claim.window.check()`
        refuses once the window has passed on this process's monotonic clock
        (`opledger.ledger.window`).

        Returns None when the operation is not prepared, or a live lease holds it (claimed
        by someone else, finished, unknown...). Raises `AuthorizationRevoked` when its
        grant is no longer active; the prepared operation is cancelled first.
        """
        return self._claim(op_id, Status.PREPARED, owner, self._terms(terms, lease), "claim")

    def claim_retry(
        self,
        op_id: str,
        *,
        owner: str,
        expected_fence: int,
        authorized_by: str | None = None,
        terms: ClaimTerms | None = None,
        lease: timedelta | None = None,
    ) -> Claim | None:
        """Take a fenced claim on an unknown operation whose retry the decision allowed.

        As `claim`, but only if nobody moved the operation since the caller read it at
        `expected_fence` (the fence the decision saw). `authorized_by` names the operator
        whose review resolution allowed it, recorded on the attempt. A revoked grant
        raises `AuthorizationRevoked` and leaves the operation unknown.
        """
        reason = "retry" if authorized_by is None else f"retry authorized by {authorized_by}"
        return self._claim(
            op_id,
            Status.UNKNOWN,
            owner,
            self._terms(terms, lease),
            reason,
            expected_fence=expected_fence,
            authorized_by=authorized_by,
        )

    def _terms(self, terms: ClaimTerms | None, lease: timedelta | None) -> ClaimTerms:
        try:
            chosen = terms or ClaimTerms()
            if lease is not None:
                chosen = ClaimTerms.model_validate(chosen.model_dump() | {"lease": lease})
        except ValidationError as exc:
            raise InvalidInput(f"claim terms: {exc.errors()[0]['msg']}", field="terms") from exc
        return chosen

    def _claim(
        self,
        op_id: str,
        from_status: Status,
        owner: str,
        terms: ClaimTerms,
        reason: str,
        *,
        expected_fence: int | None = None,
        authorized_by: str | None = None,
    ) -> Claim | None:
        check_operation_id(op_id)
        check_identifier("owner", owner)
        token = secrets.token_hex(16)
        # Read before the statement leaves: the database's now() is later than this moment,
        # so the window measured from here never ends after send_by.
        opened = clock()
        params = self._claim_params(op_id, from_status, owner, terms, reason, token)
        params.update(expected_fence=expected_fence, authorized_by=authorized_by)
        # not claimed where the ledger went back since this process saw it: the switch is
        # recorded (every open operation quarantined) first, and the claim asked again
        row, epoch = self._checked(q.CLAIM, params, by=owner, terms=terms, what=f"claiming {op_id}")
        tail = row[_CLAIM_TAIL:]
        if tail[-1]:  # suspect
            raise self._quarantine(op_id, owner, terms)
        if tail[0] is None:  # not claimed
            self._not_claimed(op_id, from_status, owner, token, tail)
            return None
        return self._claim_of(row, op_id, owner=owner, token=token, epoch=epoch, opened=opened)

    def _claim_params(
        self,
        op_id: str,
        from_status: Status,
        owner: str,
        terms: ClaimTerms,
        reason: str,
        token: str,
    ) -> dict[str, Any]:
        """The claim statement's parameters (queries.CLAIM), but the expected fence and
        who authorized a retry."""
        lease = terms.lease
        return {
            "op_id": op_id,
            "owner": owner,
            "token": token,
            "lease": lease,
            "in_flight": terms.in_flight or lease,
            "in_flight_map": terms.in_flight_json,
            "send_window": terms.send_window or self.send_window,
            "window_map": terms.send_window_json,
            "limits_map": terms.limits_json,
            "from_status": from_status.value,
            "reason": reason,
        }

    def _not_claimed(
        self, op_id: str, from_status: Status, owner: str, token: str, tail: tuple[Any, ...]
    ) -> None:
        """A claim the statement refused: `ProviderBusy` when the provider had no room;
        else a slot admitted for it is given back, and a missing operation or a revoked
        grant raises (`_explain_refused_claim`)."""
        provider, admitted, wait_s, why = tail[8:12]
        if admitted is False:
            raise ProviderBusy(
                f"{provider} is at capacity for {op_id}: {why}",
                op_id=op_id,
                provider=provider,
                retry_in=timedelta(seconds=float(wait_s)),
                why=why,
            )
        with self._single() as conn:
            if admitted:  # admitted, then another claimer took the operation first
                conn.execute(q.RELEASE_SLOT, {"token": token})
            self._explain_refused_claim(conn, op_id, from_status, owner)

    def _claim_of(
        self, row: tuple[Any, ...], op_id: str, *, owner: str, token: str, epoch: int, opened: float
    ) -> Claim:
        """The `Claim` a granted claim's row describes, its payload decrypted."""
        n_at, started_at, deadline_at, send_by, db_now, clear, key_id, sealed = row[
            _CLAIM_TAIL : _CLAIM_TAIL + 8
        ]
        # decrypted here, after the one round trip: the database never sees a key
        canonical = payload_text(self._store.payload_keys, op_id, clear, key_id, sealed)
        if canonical is None:  # purged payloads belong to finished operations only
            raise ForbiddenTransition(f"{op_id} has no frozen payload left", op_id=op_id)
        operation = store.operation_of(row)
        return Claim(
            fence=operation.fence,
            token=token,
            owner=owner,
            attempt_n=n_at,
            started_at=started_at,
            deadline_at=deadline_at,
            db_now=db_now,
            send_by=send_by,
            payload=json.loads(canonical),
            payload_canonical=canonical,
            operation=operation,
            epoch=epoch,
            window=SendWindow(op_id=op_id, send_by=send_by, length=send_by - db_now, opened=opened),
        )

    def _explain_refused_claim(
        self, conn: Connection, op_id: str, from_status: Status, owner: str
    ) -> None:
        """After a refused claim: raise for a missing operation or a revoked grant."""
        state = conn.execute(q.CLAIM_REFUSAL, {"op_id": op_id}).one_or_none()
        if state is None:
            raise OperationNotFound(f"no operation {op_id}", op_id=op_id)
        if state.grant_active:
            return
        if state.status == Status.PREPARED.value:
            conn.execute(
                q.CANCEL,
                {"op_id": op_id, "actor": owner, "reason": "authorization revoked"},
            )
        if state.status in (Status.PREPARED.value, from_status.value):
            raise AuthorizationRevoked(
                f"authorization {state.authorization_ref!r} of {op_id} is no longer active",
                op_id=op_id,
                ref=state.authorization_ref,
            )

    def record_outcome(
        self,
        claim: Claim,
        outcome: Outcome,
        *,
        recheck: timedelta = timedelta(0),
        limits: Limits | None = None,
        wake: Callable[[str], None] | None = None,
        review: Mapping[str, Any] | None = None,
    ) -> Operation:
        """Record what the provider call produced, conditional on the claim's fence.

        One statement: the attempt is closed, the evidence kept and the status moved
        (confirmed, rejected, or unknown for an ambiguous outcome, due for a check after
        `recheck`). When a newer claim holds the operation, the evidence and the attempt's
        outcome are still kept (and the record version bumped: it is a new fact), the
        status is not moved, and `StaleFence` is raised; its `status` says where the
        operation stands.

        The same statement reads what the call says about the provider (`pressure_of`):
        an answered call gives back its concurrency slot and closes an open breaker; a
        refused connection counts toward the breaker (`limits.breaker_after`); a "not now"
        pauses the provider for the wait it asked for (within `limits.retry_after_max`).
        A slot given back wakes the provider's oldest operation deferred for room (due now):
        `wake` is called with its id, to publish it (the relay does, should that be lost).

        `review`, given for a success that may repeat an earlier attempt
        (`evidence.possible_duplicate`), is the snapshot of a review to open (its "reason"
        says why) should this outcome confirm the operation: in the same statement, so the
        confirmation never commits without it. A review already open is left as it is.
        """
        outcome = _sealed(admit(None, claim, outcome), self._store.payload_keys, claim.op_id)
        limits = limits or Limits()
        binding = (
            outcome.binding
            if isinstance(outcome, Confirmed)
            else Binding(idempotency_key=claim.idempotency_key)
        )
        params = _outcome_params(claim, outcome, binding, recheck, limits)
        params.update(_review_params(review))
        # nothing is written where the ledger went back: the switch is recorded first (the
        # operation quarantined), then the outcome is kept as whatever the ledger now makes
        # of this claim
        row, _ = self._checked(
            q.RECORD_OUTCOME, params, by=claim.owner, terms=None, what=f"saving {claim.op_id}"
        )
        _announce_breaker(claim.operation.provider, row[-2], limits)
        if row[-1] is not None and wake is not None:
            wake(row[-1])
        if row[1] is not None:
            return store.operation_of(row[1:-2])
        with self._single() as conn:
            self._raise_fenced(
                conn,
                claim,
                evidence_kept=row[0] is not None,
                orphan={
                    "verdict": outcome.kind,
                    "binding": binding,
                    "detail": params["detail"],
                },
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _raise_fenced(
        self, conn: Connection, claim: Claim, *, evidence_kept: bool, orphan: dict[str, Any]
    ) -> NoReturn:
        state = conn.execute(
            q.FENCE_STATE, {"op_id": claim.op_id, "fence": claim.fence}
        ).one_or_none()
        genuine = (
            state is not None
            and state.attempt_token is not None
            and secrets.compare_digest(state.attempt_token, claim.token)
        )
        if not genuine:
            self._orphaned(claim, missing=state is None, orphan=orphan)
        assert state is not None
        raise StaleFence(
            f"claim on {claim.op_id} with fence {claim.fence} no longer holds it "
            f"(fence is {state.fence}, status {state.status})"
            + ("; its outcome was kept as evidence" if evidence_kept else "; already reported"),
            op_id=claim.op_id,
            fence=claim.fence,
            current_fence=state.fence,
            evidence_kept=evidence_kept,
            status=state.status,
        )

    def _orphaned(self, claim: Claim, *, missing: bool, orphan: dict[str, Any]) -> NoReturn:
        """An outcome for a claim the ledger has no record of: kept as an orphan receipt,
        never dropped, and said loudly. A claim issued in an earlier epoch was forgotten by
        a switch (`ClaimForgotten`; the receipt becomes its operation's evidence where the
        operation is known); one the ledger never issued is refused as before
        (`ForgedFence`, or `OperationNotFound`), its receipt kept for a person only."""
        current = self._store.witness.epoch
        forgotten = claim.epoch is not None and 0 <= claim.epoch < current
        why = "operation missing" if missing else "claim missing"
        receipt, tied_to, status = self._keep_orphan(
            claim,
            verdict=orphan["verdict"],
            binding=orphan["binding"],
            detail=orphan["detail"],
            forgotten=forgotten,
            why=why,
        )
        what = f"claim on {claim.op_id} with fence {claim.fence}"
        if forgotten:
            log.error(
                "the ledger has no record of the %s (issued in epoch %s, the ledger is in "
                "epoch %d since a switch): the provider's answer (%s) is kept as orphan "
                "receipt %d%s",
                "operation" if missing else "claim",
                claim.epoch,
                current,
                orphan["verdict"],
                receipt,
                f", evidence of {tied_to}" if tied_to else ", until its act is asked again",
                extra={"op_id": claim.op_id, "fence": claim.fence, "orphan_receipt": receipt},
            )
            raise ClaimForgotten(
                f"{what} was issued in epoch {claim.epoch} and a switch took it back; its "
                f"outcome was kept as orphan receipt {receipt}",
                op_id=claim.op_id,
                fence=claim.fence,
                orphan_id=receipt,
                evidence_kept=tied_to is not None,
                status=status,
                current_fence=None,
            )
        log.error(
            "an outcome for a %s the ledger never issued (%s) was kept as orphan receipt %d",
            what,
            why,
            receipt,
            extra={"op_id": claim.op_id, "fence": claim.fence, "orphan_receipt": receipt},
        )
        if missing:
            raise OperationNotFound(f"no operation {claim.op_id}", op_id=claim.op_id)
        raise ForgedFence(
            f"{what} was not issued by the ledger",
            op_id=claim.op_id,
            fence=claim.fence,
            orphan_id=receipt,
        )


def _sealed(outcome: Outcome, keys: PayloadKeys | None, op_id: str) -> Outcome:
    """The outcome with a provider's result document sealed like the payload, wherever the
    outcome is recorded (the attempt's response and the evidence's detail)."""
    if isinstance(outcome, Confirmed) and outcome.result is not None:
        return outcome.model_copy(update={"result": seal_result(keys, op_id, outcome.result)})
    return outcome


def _outcome_params(
    claim: Claim, outcome: Outcome, binding: Binding, recheck: timedelta, limits: Limits
) -> dict[str, Any]:
    """The outcome statement's parameters (queries.RECORD_OUTCOME): the attempt closed,
    the evidence, the status it moves to, and what the call says of its provider."""
    press = pressure_of(outcome, limits)
    return {
        "op_id": claim.op_id,
        "fence": claim.fence,
        "token": claim.token,
        "kind": outcome.kind,
        "response": outcome.model_dump_json(),
        "to_status": _STATUS_OF[outcome.kind].value,
        "receipt_id": outcome.receipt_id if isinstance(outcome, Confirmed) else None,
        "recheck": recheck,
        "source": EvidenceSource.DISPATCH.value,
        "binding": binding.model_dump_json(exclude_none=True),
        "detail": store.to_json(_detail_of(outcome)),
        "actor": claim.owner,
        "reason": _reason_of(outcome),
        "provider": claim.operation.provider,
        "release": press.release,
        "press": press.kind,
        "pause": press.pause,
        "press_reason": press.reason,
        "breaker_after": limits.breaker_after,
        "probe": limits.probe_every,
        "probe_max": limits.probe_max,
    }


def _review_params(review: Mapping[str, Any] | None) -> dict[str, Any]:
    """The outcome statement's review of a possible duplicate (none: NULL)."""
    if review is None:
        return {"review_reason": None, "review_snapshot": None}
    # never refused: the provider has acted, and its answer must be recorded whatever this is
    reason = str(review.get("reason") or POSSIBLE_DUPLICATE)[:2000]
    return {"review_reason": reason, "review_snapshot": store.to_json(dict(review))}


_STATUS_OF = {
    "confirmed": Status.CONFIRMED,
    "rejected": Status.REJECTED,
    "ambiguous": Status.UNKNOWN,
}


#: where the claim's row continues after the operation's columns (queries.CLAIM)
_CLAIM_TAIL = len(q.OPERATION_COLUMNS)


def settled_answer(op: Operation, outcome: Outcome) -> Answer | None:
    """How an agent is answered about `op` just after `record_outcome(claim, outcome)`
    settled it (confirmed or rejected): what `Ledger.answer` would read back — the
    transition's reason, the evidence's detail with its result document — without reading
    it; None when recording `outcome` did not settle it."""
    if not op.status.final or op.status is not _STATUS_OF[outcome.kind]:
        return None
    return Answer(
        operation=op,
        last_reason=_reason_of(outcome),
        settled_detail=_detail_of(outcome),
        open_review=None,
        blocked_by=(),
    )


def _detail_of(outcome: Outcome) -> dict[str, Any]:
    detail = dict(outcome.detail)
    if isinstance(outcome, Confirmed):
        detail.update(receipt_id=outcome.receipt_id, accepted_only=outcome.accepted_only)
        if outcome.result is not None:
            detail["result"] = outcome.result
    else:
        detail.update(code=outcome.code, reason=outcome.reason)
        if isinstance(outcome, Rejected) and outcome.conflicting_state:
            detail["conflicting_state"] = True
        if isinstance(outcome, Ambiguous):
            detail["replayed"] = replayed_answer(outcome)
    return detail


def _reason_of(outcome: Outcome) -> str:
    if isinstance(outcome, Confirmed):
        return "accepted by provider" if outcome.accepted_only else "provider receipt"
    return f"{outcome.kind}: {outcome.code}"


def _announce_breaker(provider: str, breaker: str | None, limits: Limits) -> None:
    """A warning when this outcome opened the provider's breaker, and when it closed it."""
    if breaker == "opened":
        log.warning(
            "%s: %d consecutive refusals to connect; dispatch to it is paused (its breaker "
            "is open) and one call at a time probes it, the first in %s",
            provider,
            limits.breaker_after,
            limits.probe_every,
            extra={"provider": provider},
        )
    elif breaker == "closed":
        log.warning(
            "%s answered again: its breaker is closed", provider, extra={"provider": provider}
        )
