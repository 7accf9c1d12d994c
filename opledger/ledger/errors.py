"""Every error the ledger raises, under one root.

Each leaf carries structured fields; its docstring is the default message. Callers catch
`LedgerError` to handle everything the ledger refuses; none of these leave the database
half-written.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any


class LedgerError(Exception):
    """The ledger refused the request."""

    def __init__(self, message: str | None = None, **fields: Any) -> None:
        self.fields = fields
        for name, value in fields.items():
            setattr(self, name, value)
        super().__init__(message or (self.__doc__ or self.__class__.__name__).strip())


class InvalidInput(LedgerError, ValueError):
    """The input is malformed; nothing was written."""


class MalformedOperationId(InvalidInput):
    """Not an operation id: expected 'op_' followed by a 26-character ULID."""


class InvalidIdentifier(InvalidInput):
    """An identifier is empty, too long (in NFC), or contains a character it may not: a
    control character, one that renders as nothing, an unassigned or private-use one."""


class UnknownAction(InvalidInput):
    """The action is not a registered, versioned action."""


class PayloadNotCanonicalizable(InvalidInput):
    """The payload cannot be written as canonical JSON (RFC 8785)."""


class PayloadTooLarge(InvalidInput):
    """The canonical payload is larger than the configured limit."""


class PayloadTooDeep(InvalidInput):
    """The payload nests objects and arrays deeper than the limit."""


class PayloadSchemaViolation(InvalidInput):
    """The payload does not fit its action's declared schema: `field` names the first
    problem's place (`payload.amount`), `problems` each one."""

    field: str
    action: str
    problems: tuple[str, ...]


class IntentConflict(LedgerError):
    """This intent key already names a different action, target, payload or authorization.

    A changed recipient, amount or business intent is a new intent key under its own
    authorization, never an edit of the old one.
    """


class IntentFieldsUndeclared(LedgerError):
    """Nothing declares what makes another act of this action (`Ledger.intent_fields`):
    the ledger was built without the adapter registry. A setup error, not the caller's."""


class OperationNotFound(LedgerError, LookupError):
    """No operation with this id."""


class DependencyError(InvalidInput):
    """The operations named in `after` cannot be run after: nothing was written."""


class UnknownDependency(DependencyError, LookupError):
    """An operation named in `after` does not exist in this tenant."""


class DependencyCycle(DependencyError):
    """Running after these operations would make an operation wait on itself."""


class AuthorizationError(LedgerError):
    """The authorization does not allow this write."""


class UnknownAuthorization(AuthorizationError):
    """No authorization with this reference for this tenant."""


class AuthorizationRevoked(AuthorizationError):
    """The authorization was revoked or has expired; no new write may be made under it."""


class OutOfScope(AuthorizationError):
    """The authorization does not cover this action."""


class ForbiddenTransition(LedgerError):
    """The operation's status does not allow this transition."""


class FenceError(LedgerError):
    """The claim no longer (or never did) hold the operation; nothing was moved."""


class ProviderBusy(LedgerError):
    """The operation's provider is at its declared limits, or pushing back (a "not now", an
    open breaker): no claim was taken, nothing was written. `retry_in` says when to try
    again, `why` says what holds it back."""

    op_id: str
    provider: str
    retry_in: timedelta
    why: str


class StaleFence(FenceError):
    """A newer claim holds the operation: this claim's writes are refused.

    Its outcome, if it reported one, was kept as evidence.
    """


class ForgedFence(FenceError):
    """This claim was never issued by the ledger for this operation."""


class ClaimForgotten(StaleFence):
    """The ledger has no record of this claim, or of its operation, although it issued it in
    an earlier epoch: a switch (a failover to a standby that was behind, a restore) took it
    back. The outcome it reported was kept as an orphan receipt (`orphan_id`), tied to its
    operation as evidence where the operation is known; never dropped."""


class Quarantined(LedgerError):
    """The operation was not claimed: the ledger may have forgotten an earlier ask or
    attempt of its act (a switch), so it went to `unknown`, where its provider's evidence
    decides (a lookup by its key, a same-key retry the provider deduplicates) or a person."""


class FenceWentBack(FenceError):
    """A write would have lowered an operation's fence; the database refused it."""


class ReviewError(LedgerError):
    """The review request was refused; nothing changed."""


class ReviewNotFound(ReviewError, LookupError):
    """No open review for this operation in this tenant."""


class ReviewAlreadyResolved(ReviewError):
    """This review was already resolved."""


class StaleView(ReviewError):
    """The operation changed since it was shown: look at it again before deciding."""


class RetryNeedsNewKey(ReviewError):
    """A same-key retry is unsafe here; acknowledge the risk with a new key."""


class RetryNeedsAcknowledgement(ReviewError):
    """This retry could repeat the effect (the provider does not deduplicate): say that
    you accept the risk you were shown (`acknowledge_risk=True`, `--accept-risk`)."""


class ResolutionNotAllowed(ReviewError):
    """This resolution does not fit the review: a settled operation's review (a possible
    duplicate) is only acknowledged, and an unknown operation's is never just acknowledged."""


class ContradictsEvidence(ReviewError):
    """The resolution contradicts evidence on record that binds this operation (a receipt
    that confirms it, a definitive refusal): it needs an explicit override."""


class DatabaseUnavailable(LedgerError):
    """The ledger's database could not be reached, or asked for the work to be retried
    (connection lost, restarting, serialization failure). Transient: retry later."""


class SchemaMissing(LedgerError):
    """The ledger's tables are missing or out of date: run `opledger migrate`."""


class SendWindowPassed(LedgerError):
    """The claim's send-by window has passed: nothing may be sent under it any more."""


class ApprovalPolicyInvalid(InvalidInput):
    """An action's approval policy is malformed: `action` names it, the message says what."""

    action: str


class ApprovalError(LedgerError):
    """The approval request was refused; nothing changed."""


class ApprovalNotFound(ApprovalError, LookupError):
    """No approval is asked for this operation: its action's policy did not require one
    when it was recorded (or there is no such operation)."""


class ApprovalAlreadyDecided(ApprovalError):
    """This approval was already decided (approved, denied or expired), or its operation is
    no longer waiting for it; `status` says how it stands."""


class StaleApproval(ApprovalError):
    """The digest you were shown is not the operation's frozen payload's: look at it again
    (`opledger approvals show`) before deciding. `digest` is the operation's."""

    digest: str


class NotAnApprover(ApprovalError):
    """This operator may not approve this operation: unknown or disabled, not acting for its
    tenant, no approval scope covering its action, or the one who asked for it."""


class ApprovalAlreadyGiven(ApprovalError):
    """This operator has approved already; the same person twice counts once, and another
    person must approve."""
