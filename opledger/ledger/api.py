"""The ledger's Python API: prepare, claim, record outcomes, read history.

All SQL the ledger runs lives in `opledger.ledger.queries`, and every use of the database
goes through `opledger.ledger.store` (transactions, error translation, row mapping); this
module validates input and chooses the statements. The worker's happy path is two round
trips to Postgres: `claim` and `record_outcome` are one autocommitted statement each.
"""

from __future__ import annotations

import fnmatch
import json
import os
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NoReturn, Protocol

from pydantic import ValidationError
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.orm import Session

from . import backlog, store
from . import queries as q
from .backlog import RELAY_MAX_DOUBLINGS, Handout
from .canonical import DEFAULT_MAX_PAYLOAD_BYTES, canonicalize
from .decide import admit
from .errors import (
    AuthorizationError,
    AuthorizationRevoked,
    DependencyCycle,
    ForbiddenTransition,
    ForgedFence,
    IntentConflict,
    IntentFieldsUndeclared,
    InvalidInput,
    OperationNotFound,
    OutOfScope,
    StaleFence,
    UnknownAuthorization,
    UnknownDependency,
)
from .ids import (
    check_action,
    check_identifier,
    check_key,
    check_operation_id,
    check_operator,
    evidence_text,
    new_operation_id,
)
from .intents import check_fields
from .migrate import sqlalchemy_url
from .models import (
    Ambiguous,
    Ask,
    Asked,
    Authorization,
    Binding,
    Claim,
    ClaimTerms,
    Confirmed,
    Dependency,
    Evidence,
    EvidenceSource,
    History,
    Operation,
    Outcome,
    Rejected,
    Review,
    Status,
    Verdict,
)
from .reviews import Reviews
from .store import Store
from .window import SendWindow, clock

DEFAULT_LEASE = timedelta(seconds=60)
#: how long a claim may start its request when no provider-specific window is given
DEFAULT_SEND_WINDOW = timedelta(seconds=10)
SCOPE_PATTERN_MAX = 120


class ActionResolver(Protocol):
    """Says which provider serves an action, or raises `UnknownAction`.

    A resolver may also declare what makes another act of an action, as
    `intent_fields(action) -> tuple[str, ...]` (the adapter registry does): the payload
    fields an agent's intent is derived from (`opledger.ledger.intents`). Without it,
    `Ledger.intent_fields` raises `IntentFieldsUndeclared`."""

    def provider_for(self, action: str) -> str: ...


class PrefixResolver:
    """Accept any well-formed versioned action; its first segment names the provider. It
    declares no action's intent fields, so an agent's intent cannot be derived through it
    (`Ledger.intent_fields` raises `IntentFieldsUndeclared`).

    The composition root replaces this with the adapter registry, which refuses actions
    no adapter serves.
    """

    def provider_for(self, action: str) -> str:
        return check_action(action).split(".", 1)[0]


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


@dataclass(frozen=True)
class _SameIntent:
    """What a call asked, to compare with the operation its intent already names."""

    #: the action, target, payload digest and authorization of the call
    asked: tuple[str, str, str, str]
    deps: tuple[str, ...]
    notify: bool
    #: `ask`'s asker ("asked_by", "actor"); None for `prepare`, which refuses a difference
    ask: dict[str, str | None] | None


class Ledger:
    """The durable record of intended external effects, on Postgres.

    Thread-safe: each call checks a connection out of the engine's pool. Share one Ledger
    per process; after a fork, call `dispose()` in the child before first use.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        actions: ActionResolver | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        send_window: timedelta = DEFAULT_SEND_WINDOW,
    ) -> None:
        if send_window <= timedelta(0):
            raise InvalidInput("send_window must be positive", field="send_window")
        self.engine = engine
        self._store = Store(engine)
        self._tx = self._store.transaction
        self._single = self._store.statement
        self.actions: ActionResolver = actions or PrefixResolver()
        self.max_payload_bytes = max_payload_bytes
        self.send_window = send_window

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        actions: ActionResolver | None = None,
        max_payload_bytes: int | None = None,
        pool_size: int = 5,
    ) -> Ledger:
        """A ledger on the Postgres database at `url` (any postgresql:// form).

        `max_payload_bytes` defaults to the `OPLEDGER_MAX_PAYLOAD_BYTES` setting, as the
        workers read it.
        """
        if max_payload_bytes is None:
            max_payload_bytes = _payload_limit_from_environment()
        engine = create_engine(
            sqlalchemy_url(url), pool_size=pool_size, max_overflow=pool_size, pool_recycle=1800
        )
        return cls(engine, actions=actions, max_payload_bytes=max_payload_bytes)

    @property
    def reviews(self) -> Reviews:
        """The operator review queue (list, show, resolve), scoped per tenant."""
        contract_for = getattr(self.actions, "contract_for", None)
        return Reviews(self._store, contract_for if callable(contract_for) else None)

    def dispose(self) -> None:
        """Drop pooled connections (call in a forked child; never share them across fork)."""
        self._store.dispose()

    # -- authorizations ----------------------------------------------------------------

    def grant(
        self,
        *,
        tenant: str,
        scope: Sequence[str],
        granted_by: str,
        ref: str | None = None,
        expires_at: datetime | None = None,
    ) -> Authorization:
        """Record a grant letting `tenant` write the actions matching `scope`.

        Granting the same ref again with the same tenant and scope returns it unchanged.
        """
        tenant = check_key("tenant", tenant)
        granted_by = check_operator("granted_by", granted_by)
        ref = check_identifier("ref", ref) if ref is not None else f"auth_{new_operation_id()[3:]}"
        patterns = _check_scope(scope)
        if expires_at is not None and expires_at.tzinfo is None:
            raise InvalidInput("expires_at must be timezone-aware", field="expires_at")
        with self._tx() as conn:
            row = conn.execute(
                q.INSERT_AUTHORIZATION,
                {
                    "ref": ref,
                    "tenant": tenant,
                    "scope": list(patterns),
                    "granted_by": granted_by,
                    "expires_at": expires_at,
                },
            ).one_or_none()
            if row is None:
                row = conn.execute(q.SELECT_AUTHORIZATION, {"ref": ref}).one()
                if row.tenant != tenant or tuple(row.scope) != patterns:
                    raise AuthorizationError(
                        f"authorization {ref!r} already exists with another tenant or scope",
                        ref=ref,
                    )
        return store.authorization(row)

    def revoke(self, ref: str, *, by: str, reason: str) -> Authorization:
        """Revoke a grant. New writes under it stop; lookups and evidence continue.

        Prepared operations under it are cancelled when a worker next tries to claim them.
        Revoking twice keeps the first revocation.
        """
        check_identifier("ref", ref)
        by = check_operator("by", by)
        check_identifier("reason", reason, max_length=2000)
        with self._tx() as conn:
            row = conn.execute(q.REVOKE_AUTHORIZATION, {"ref": ref, "by": by, "reason": reason})
            found = (
                row.one_or_none()
                or conn.execute(q.SELECT_AUTHORIZATION, {"ref": ref}).one_or_none()
            )
        if found is None:
            raise UnknownAuthorization(f"no authorization {ref!r}", ref=ref)
        return store.authorization(found)

    def authorization(self, ref: str) -> Authorization:
        """The grant named `ref`."""
        check_identifier("ref", ref)
        with self._single() as conn:
            row = conn.execute(q.SELECT_AUTHORIZATION, {"ref": ref}).one_or_none()
        if row is None:
            raise UnknownAuthorization(f"no authorization {ref!r}", ref=ref)
        return store.authorization(row)

    def authorizations(
        self, *, tenant: str | None = None, limit: int = 100
    ) -> tuple[Authorization, ...]:
        """Grants, newest first (revoked and expired ones too); only `tenant`'s when given."""
        if tenant is not None:
            tenant = check_key("tenant", tenant)
        with self._single() as conn:
            rows = conn.execute(
                q.LIST_AUTHORIZATIONS, {"tenant": tenant, "limit": max(1, min(limit, 10_000))}
            )
            return tuple(store.authorization(r) for r in rows)

    # -- prepare -----------------------------------------------------------------------

    def prepare(
        self,
        *,
        tenant: str,
        workflow_id: str,
        intent_key: str,
        action: str,
        target: str,
        payload: Mapping[str, Any],
        authorization_ref: str,
        session: Session | None = None,
        actor: str = "prepare",
        after: Sequence[str] = (),
        notify: bool = False,
        traceparent: str | None = None,
    ) -> Operation:
        """Record an intended effect before anything crosses the boundary.

        Idempotent per (tenant, workflow_id, intent_key): the same call again returns the
        same operation. The same intent with another action, target, payload,
        authorization or `after` raises `IntentConflict`. `tenant`, `workflow_id`,
        `intent_key` and `target` are normalised to Unicode NFC (an NFD spelling names the
        same operation) and may not contain invisible characters. With `session=`, the
        insert joins the caller's transaction (outbox): it exists only if the caller commits.

        `after` names operations (of the same tenant) this one runs after: it is claimed
        only once all of them are confirmed; if one is (or becomes) rejected or cancelled,
        this one is cancelled with that reason; while one is unknown, it waits
        (`dependencies()` says on what). An unknown id raises `UnknownDependency`, an
        `after` that would make an operation wait on itself `DependencyCycle`.
        `notify=True` makes every status change (and review) of it a `NOTIFY
        opledger_settle` in the transaction that makes it (what `opledger.agents` waits on).
        `traceparent` is the caller's trace context (opledger's tracing passes a W3C
        `traceparent`), kept opaque on the new operation for the workers' spans to link
        back to; a replayed call keeps the first one.
        """
        return self._prepare(
            tenant=tenant,
            workflow_id=workflow_id,
            intent_key=intent_key,
            action=action,
            target=target,
            payload=payload,
            authorization_ref=authorization_ref,
            session=session,
            actor=actor,
            after=after,
            notify=notify,
            traceparent=traceparent,
            asking=False,
            asked_by=None,
        ).operation

    def ask(
        self,
        *,
        tenant: str,
        workflow_id: str,
        intent_key: str,
        action: str,
        target: str,
        payload: Mapping[str, Any],
        authorization_ref: str,
        asked_by: str | None = None,
        actor: str = "agent",
        after: Sequence[str] = (),
        notify: bool = False,
        traceparent: str | None = None,
    ) -> Asked:
        """`prepare` as an agent asks for an effect: an intent asked again is answered with
        the operation it recorded, never refused.

        Where `prepare` raises `IntentConflict`, `ask` returns the recorded operation and
        what this ask asked differently (`Asked.differs`: the action, the target, the
        payload digest, the authorization, `after`); nothing of the difference is recorded
        as an effect, so nothing of it is ever sent. An intent already recorded is answered
        even when the grant this ask names was revoked or has expired (that reads what was
        done); the grant must still be the tenant's and cover the action. A new intent
        needs an active grant covering the action, as with `prepare`. Every ask is kept
        (`asks(op_id)`), with `asked_by` — the asker's own id for the call, a model's
        tool-call id or an MCP request id — as evidence of which call asked (kept as text,
        control characters replaced, never refused). That id is never the intent: derive
        `intent_key` from the act (`opledger.ledger.intents.intent_key`)."""
        return self._prepare(
            tenant=tenant,
            workflow_id=workflow_id,
            intent_key=intent_key,
            action=action,
            target=target,
            payload=payload,
            authorization_ref=authorization_ref,
            session=None,
            actor=actor,
            after=after,
            notify=notify,
            traceparent=traceparent,
            asking=True,
            asked_by=evidence_text(asked_by),
        )

    def asks(self, op_id: str) -> tuple[Ask, ...]:
        """Every ask of `op_id`'s intent through `ask`, oldest first (none for what only
        `prepare` recorded: it keeps no asks)."""
        check_operation_id(op_id)
        with self._single() as conn:
            rows = conn.execute(q.SELECT_ASKS, {"op_id": op_id}).all()
        if not rows:
            self.get(op_id)
        return tuple(store.record(Ask, r) for r in rows)

    def _prepare(
        self,
        *,
        tenant: str,
        workflow_id: str,
        intent_key: str,
        action: str,
        target: str,
        payload: Mapping[str, Any],
        authorization_ref: str,
        session: Session | None,
        actor: str,
        after: Sequence[str],
        notify: bool,
        traceparent: str | None,
        asking: bool,
        asked_by: str | None,
    ) -> Asked:
        tenant = check_key("tenant", tenant)
        if traceparent is not None:
            check_identifier("traceparent", traceparent, max_length=TRACEPARENT_MAX)
        workflow_id = check_key("workflow_id", workflow_id)
        intent_key = check_key("intent_key", intent_key)
        target = check_key("target", target)
        check_identifier("authorization_ref", authorization_ref)
        check_action(action)
        deps = _check_after(after)
        provider = self.actions.provider_for(action)
        frozen = canonicalize(payload, max_bytes=self.max_payload_bytes)
        intent = {"tenant": tenant, "workflow_id": workflow_id, "intent_key": intent_key}
        same = _SameIntent(
            asked=(action, target, frozen.digest, authorization_ref),
            deps=deps,
            notify=notify,
            ask={"asked_by": asked_by, "actor": actor} if asking else None,
        )
        with self._tx(session) as conn:
            grant = conn.execute(q.SELECT_AUTHORIZATION, {"ref": authorization_ref}).one_or_none()
            try:
                _check_grant(grant, tenant=tenant, action=action, ref=authorization_ref)
            except AuthorizationRevoked:
                # an ask of an intent already recorded reads what was done: no new write is
                # made under this grant, the tenant's, covering the action (checked first)
                if not asking:
                    raise
                existing_row = conn.execute(q.SELECT_OPERATION_BY_INTENT, intent).one_or_none()
                if existing_row is None:
                    raise
                return self._same_intent(conn, store.operation(existing_row), same)
            blocking, doomed = 0, None
            if deps:
                existing_row = conn.execute(q.SELECT_OPERATION_BY_INTENT, intent).one_or_none()
                if existing_row is not None:  # a replayed step: lock nothing, insert nothing
                    return self._same_intent(conn, store.operation(existing_row), same)
                blocking, doomed = self._lock_dependencies(conn, tenant, deps)
            op_id = new_operation_id()
            row = conn.execute(
                q.INSERT_OPERATION,
                {
                    "id": op_id,
                    **intent,
                    "action": action,
                    "target": target,
                    "provider": provider,
                    "payload_digest": frozen.digest,
                    "payload_size": frozen.size,
                    "authorization_ref": authorization_ref,
                    "idempotency_key": op_id,
                    "canonical": frozen.text,
                    "actor": actor,
                    "waiting_on": blocking,
                    "notify_settle": notify,
                    "traceparent": traceparent,
                    "asked_by": asked_by,
                    "record_ask": asking,
                },
            ).one_or_none()
            if row is None:  # another caller inserted the same intent just now
                row = conn.execute(q.SELECT_OPERATION_BY_INTENT, intent).one()
                return self._same_intent(conn, store.operation(row), same)
            if deps:
                conn.execute(q.INSERT_DEPENDENCIES, {"op_id": op_id, "after": list(deps)})
            if doomed is not None:
                row = conn.execute(
                    q.CANCEL, {"op_id": op_id, "actor": "dependency", "reason": doomed}
                ).one()
        return Asked(operation=store.operation(row), first=True)

    def _lock_dependencies(
        self, conn: Connection, tenant: str, deps: tuple[str, ...]
    ) -> tuple[int, str | None]:
        """Lock and mark the operations `deps` names: how many are not confirmed, and why
        the new operation is cancelled at once (one of them rejected or cancelled)."""
        if not deps:
            return 0, None
        rows = conn.execute(q.LOCK_DEPENDENCIES, {"after": list(deps), "tenant": tenant}).all()
        missing = sorted(set(deps) - {r.id for r in rows})
        if missing:
            raise UnknownDependency(
                f"after names no operation {', '.join(missing)} of tenant {tenant!r}",
                op_ids=tuple(missing),
            )
        blocking = sum(1 for r in rows if r.status != Status.CONFIRMED.value)
        failed = sorted(
            (r for r in rows if r.status in (Status.REJECTED.value, Status.CANCELLED.value)),
            key=lambda r: r.id,
        )
        doomed = None
        if failed:
            first = failed[0]
            doomed = (
                f"dependency {first.id} was {first.status} "
                f"({first.change_reason or 'no reason given'})"
            )
        return blocking, doomed

    def _same_intent(self, conn: Connection, existing: Operation, same: _SameIntent) -> Asked:
        """The operation a replayed prepare (or a repeated ask) names. `prepare` refuses
        another action, target, payload, authorization or `after` (`IntentConflict`); an
        ask is answered with the recorded operation and what it asked differently."""
        names = ("action", "target", "payload_digest", "authorization_ref")
        differs = [
            n for n, mine in zip(names, same.asked, strict=True) if getattr(existing, n) != mine
        ]
        recorded = set(conn.execute(q.SELECT_DEPENDENCY_IDS, {"op_id": existing.id}).scalars())
        if recorded != set(same.deps):
            if (
                same.ask is None
                and same.deps
                and conn.execute(
                    q.REACHES, {"after": list(same.deps), "op_id": existing.id}
                ).scalar_one()
            ):
                raise DependencyCycle(
                    f"{existing.id} ({existing.workflow_id} / {existing.intent_key}) cannot "
                    "run after operations that run after it, or after itself",
                    op_id=existing.id,
                )
            differs.append("after")
        if differs and same.ask is None:
            raise IntentConflict(
                f"intent {existing.intent_key!r} of workflow {existing.workflow_id!r} already "
                f"names operation {existing.id} with a different {', '.join(differs)}",
                op_id=existing.id,
                differs=tuple(differs),
            )
        if same.ask is not None:
            conn.execute(
                q.INSERT_ASK,
                {
                    "op_id": existing.id,
                    **same.ask,
                    "payload_digest": same.asked[2],
                    "authorization_ref": same.asked[3],
                    "differs": differs,
                },
            )
        if same.notify:
            conn.execute(q.WATCH, {"op_id": existing.id})
        return Asked(operation=existing, first=False, differs=tuple(differs))

    def dependencies(self, op_id: str) -> tuple[Dependency, ...]:
        """The operations `op_id` runs after, as they stand now (with the open review of
        any that a person holds): what it waits for, if anything."""
        check_operation_id(op_id)
        with self._single() as conn:
            rows = conn.execute(q.SELECT_DEPENDENCIES, {"op_id": op_id}).all()
        if not rows:
            self.get(op_id)
        return tuple(store.record(Dependency, r) for r in rows)

    def watch(self, op_id: str) -> None:
        """Have every later status change (and review) of `op_id` NOTIFY `opledger_settle`."""
        check_operation_id(op_id)
        with self._single() as conn:
            conn.execute(q.WATCH, {"op_id": op_id})

    def intent_fields(self, action: str) -> tuple[str, ...]:
        """The payload fields that make another act of `action`, as the action resolver
        (the adapter registry) declares them. Raises `IntentFieldsUndeclared` when the
        resolver declares none (the default `PrefixResolver`): every process must derive
        an act's intent from the same declaration, or one act gets two keys."""
        declared = getattr(self.actions, "intent_fields", None)  # a resolver of your own
        if not callable(declared):
            raise IntentFieldsUndeclared(
                f"nothing declares the intent fields of {action!r}: build the Ledger with the "
                "adapter registry (Ledger.from_url(url, actions=load_registry(settings)), as "
                "opledger.tasks.app.runtime().ledger is), or give intent_fields= (or step=)"
            )
        return check_fields(declared(action))

    # -- reads -------------------------------------------------------------------------

    def get(self, op_id: str) -> Operation:
        """The operation `op_id`, as it stands now."""
        check_operation_id(op_id)
        with self._single() as conn:
            row = conn.execute(q.SELECT_OPERATION, {"op_id": op_id}).one_or_none()
        if row is None:
            raise OperationNotFound(f"no operation {op_id}", op_id=op_id)
        return store.operation(row)

    def payload(self, op_id: str) -> dict[str, Any] | None:
        """The frozen payload of `op_id`, or None once it has been purged."""
        check_operation_id(op_id)
        with self._single() as conn:
            text = conn.execute(q.SELECT_PAYLOAD, {"op_id": op_id}).scalar_one_or_none()
        if text is None:
            self.get(op_id)
            return None
        value: dict[str, Any] = json.loads(text)
        return value

    def history(self, op_id: str) -> History:
        """Everything recorded about `op_id`: attempts, evidence, transitions and reviews."""
        check_operation_id(op_id)
        with self._store.snapshot() as conn:
            return self._store.history(conn, op_id)

    # -- the fenced claim ----------------------------------------------------------------

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
        lease = terms.lease
        token = secrets.token_hex(16)
        # Read before the statement leaves: the database's now() is later than this moment,
        # so the window measured from here never ends after send_by.
        opened = clock()
        row = self._store.hot(
            q.CLAIM,
            {
                "op_id": op_id,
                "owner": owner,
                "token": token,
                "lease": lease,
                "in_flight": terms.in_flight or lease,
                "in_flight_map": terms.in_flight_json,
                "send_window": terms.send_window or self.send_window,
                "window_map": terms.send_window_json,
                "from_status": from_status.value,
                "expected_fence": expected_fence,
                "authorized_by": authorized_by,
                "reason": reason,
            },
        )
        if row is None:
            with self._single() as conn:
                self._explain_refused_claim(conn, op_id, from_status, owner)
            return None
        n_at, started_at, deadline_at, send_by, db_now, canonical = row[_CLAIM_TAIL:]
        if canonical is None:  # purged payloads belong to finished operations only
            raise ForbiddenTransition(f"{op_id} has no frozen payload left", op_id=op_id)
        operation = store.operation_of(row)
        return Claim(
            op_id=op_id,
            fence=operation.fence,
            token=token,
            owner=owner,
            lease_expires_at=operation.lease_expires_at,
            attempt_n=n_at,
            started_at=started_at,
            deadline_at=deadline_at,
            db_now=db_now,
            send_by=send_by,
            idempotency_key=operation.idempotency_key,
            payload=json.loads(canonical),
            payload_canonical=canonical,
            operation=operation,
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
        self, claim: Claim, outcome: Outcome, *, recheck: timedelta = timedelta(0)
    ) -> Operation:
        """Record what the provider call produced, conditional on the claim's fence.

        One statement: the attempt is closed, the evidence kept and the status moved
        (confirmed, rejected, or unknown for an ambiguous outcome, due for a check after
        `recheck`). When a newer claim holds the operation, the evidence and the attempt's
        outcome are still kept (and the record version bumped: it is a new fact), the
        status is not moved, and `StaleFence` is raised; its `status` says where the
        operation stands.
        """
        outcome = admit(None, claim, outcome)
        to_status = _STATUS_OF[outcome.kind]
        binding = (
            outcome.binding
            if isinstance(outcome, Confirmed)
            else Binding(idempotency_key=claim.idempotency_key)
        )
        row = self._store.hot(
            q.RECORD_OUTCOME,
            {
                "op_id": claim.op_id,
                "fence": claim.fence,
                "token": claim.token,
                "kind": outcome.kind,
                "response": outcome.model_dump_json(),
                "to_status": to_status.value,
                "receipt_id": outcome.receipt_id if isinstance(outcome, Confirmed) else None,
                "recheck": recheck,
                "source": EvidenceSource.DISPATCH.value,
                "binding": binding.model_dump_json(exclude_none=True),
                "detail": _json(_detail_of(outcome)),
                "actor": claim.owner,
                "reason": _reason_of(outcome),
            },
        )
        assert row is not None  # the statement always returns its one row
        if row[1] is not None:
            return store.operation_of(row[1:])
        with self._single() as conn:
            self._raise_fenced(conn, claim, evidence_kept=row[0] is not None)
        raise AssertionError("unreachable")  # pragma: no cover

    def _raise_fenced(self, conn: Connection, claim: Claim, *, evidence_kept: bool) -> NoReturn:
        state = conn.execute(
            q.FENCE_STATE, {"op_id": claim.op_id, "fence": claim.fence}
        ).one_or_none()
        if state is None:
            raise OperationNotFound(f"no operation {claim.op_id}", op_id=claim.op_id)
        genuine = state.attempt_token is not None and secrets.compare_digest(
            state.attempt_token, claim.token
        )
        if not genuine:
            raise ForgedFence(
                f"claim on {claim.op_id} with fence {claim.fence} was not issued by the ledger",
                op_id=claim.op_id,
                fence=claim.fence,
            )
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

    # -- reconciliation -----------------------------------------------------------------

    def record_evidence(
        self,
        op_id: str,
        *,
        source: EvidenceSource | str,
        verdict: Verdict | str,
        binding: Binding | None = None,
        detail: Mapping[str, Any] | None = None,
        attempt_n: int | None = None,
        fence: int | None = None,
    ) -> Evidence:
        """Append a fact learned about `op_id` (a lookup result, an operator's note).

        Evidence never moves the status by itself: `settle` does, citing it.
        """
        check_operation_id(op_id)
        try:
            source, verdict = EvidenceSource(source), Verdict(verdict)
        except ValueError as exc:
            raise InvalidInput(
                f"evidence source must be one of {[s.value for s in EvidenceSource]} and its "
                f"verdict one of {[v.value for v in Verdict]}: {exc}",
                field="evidence",
            ) from exc
        with self._single() as conn:
            row = conn.execute(
                q.INSERT_EVIDENCE,
                {
                    "op_id": op_id,
                    "attempt_n": attempt_n,
                    "fence": fence,
                    "source": source.value,
                    "verdict": verdict.value,
                    "binding": _json(
                        (binding or Binding()).model_dump(mode="json", exclude_none=True)
                    ),
                    "detail": _json(dict(detail or {})),
                },
            ).one_or_none()
        if row is None:
            raise OperationNotFound(f"no operation {op_id}", op_id=op_id)
        return store.record(Evidence, row)

    def settle(
        self,
        op_id: str,
        *,
        fence: int,
        to: Status,
        evidence_id: int,
        actor: str,
        reason: str,
        receipt_id: str | None = None,
    ) -> Operation:
        """Settle an unknown operation as confirmed or rejected, citing the evidence.

        Conditional on `fence` (what the caller saw when it decided): when anyone moved
        the operation since, `StaleFence` is raised and nothing changes.
        """
        check_operation_id(op_id)
        if to not in (Status.CONFIRMED, Status.REJECTED):
            raise ForbiddenTransition(
                f"settle moves an operation to confirmed or rejected, not {to}"
            )
        with self._single() as conn:
            row = conn.execute(
                q.SETTLE_ON_EVIDENCE,
                {
                    "op_id": op_id,
                    "fence": fence,
                    "to_status": to.value,
                    "evidence_id": evidence_id,
                    "receipt_id": receipt_id,
                    "actor": actor,
                    "reason": reason,
                },
            ).one_or_none()
        if row is None:
            self._raise_moved(op_id, fence)
        return store.operation(row)

    def schedule_check(self, op_id: str, *, fence: int, at: datetime) -> Operation:
        """Ask the sweeper to reconcile an unknown operation again at `at`."""
        check_operation_id(op_id)
        with self._single() as conn:
            row = conn.execute(
                q.SCHEDULE_CHECK, {"op_id": op_id, "fence": fence, "next_check_at": at}
            ).one_or_none()
        if row is None:
            self._raise_moved(op_id, fence)
        return store.operation(row)

    def open_review(
        self, op_id: str, *, fence: int, reason: str, snapshot: Mapping[str, Any] | None = None
    ) -> Review | None:
        """Hand an unknown operation to a person; None if a review is already open.

        The status stays unknown until the review is resolved; the sweeper stops checking it.
        """
        check_operation_id(op_id)
        check_identifier("reason", reason, max_length=2000)
        with self._single() as conn:
            row = conn.execute(
                q.OPEN_REVIEW,
                {
                    "op_id": op_id,
                    "fence": fence,
                    "reason": reason,
                    "snapshot": _json(dict(snapshot or {})),
                },
            ).one_or_none()
        if row is None:
            current = self.get(op_id)
            if current.status is not Status.UNKNOWN or current.fence != fence:
                self._raise_moved(op_id, fence)
            return None
        return store.record(Review, row)

    def _raise_moved(self, op_id: str, fence: int) -> NoReturn:
        current = self.get(op_id)
        raise StaleFence(
            f"{op_id} moved since fence {fence} (now {current.status}, fence {current.fence})",
            op_id=op_id,
            fence=fence,
            current_fence=current.fence,
            evidence_kept=False,
        )

    # -- maintenance (beat) ---------------------------------------------------------------

    def expire_leases(
        self, *, limit: int = 500, backoff: timedelta = timedelta(0), actor: str = "sweeper"
    ) -> list[str]:
        """Fence out claims whose lease expired: dispatching -> unknown, fence + 1.

        The stalled or dead worker can no longer write; the operations are due for
        reconciliation after `backoff`. Safe to run from two sweepers at once.
        """
        with self._single() as conn:
            rows = conn.execute(
                q.EXPIRE_LEASES, {"limit": limit, "backoff": backoff, "actor": actor}
            )
            return [r.id for r in rows]

    def due_checks(self, *, limit: int = 500, backoff: timedelta) -> list[str]:
        """Unknown operations whose check is due; each is pushed `backoff` into the future
        so it is handed out once per backoff, even when its reconcile message is lost."""
        return [h.op_id for h in self.hand_out_checks(limit=limit, backoff=backoff)]

    def hand_out_checks(
        self,
        *,
        limit: int = 500,
        backoff: timedelta,
        depth: int | None = None,
        interval: timedelta | None = None,
        queue: str = "reconcile",
    ) -> list[Handout]:
        """Due checks to hand to reconcile, each numbered (its `check_gen`).

        With `interval` (the sweep's) the backlog guard applies: `depth` is the reconcile
        queue's depth now, and checks are handed out only until the queue holds what the
        workers drain in two intervals, so a check does not wait in the queue long enough
        to fall due again: at most one outstanding check per operation.
        """
        rows: Sequence[Any] = []
        if interval is None:
            with self._single() as conn:
                rows = conn.execute(q.DUE_CHECKS, {"limit": limit, "backoff": backoff}).all()
            return [Handout(r.id, r.check_gen) for r in rows]
        with self._tx() as conn:
            budget = self._guard(conn, queue, depth=depth, interval=interval, limit=limit)
            if budget.allowed:
                rows = conn.execute(
                    q.DUE_CHECKS, {"limit": budget.allowed, "backoff": backoff}
                ).all()
            self._save_guard(conn, queue, budget.state, published=len(rows))
        return [Handout(r.id, r.check_gen) for r in rows]

    def relay(
        self,
        *,
        older_than: timedelta,
        publish: Callable[[str, int], None],
        limit: int = 500,
        before_mark: Callable[[], None] | None = None,
        depth: int | None = None,
        interval: timedelta | None = None,
        queue: str = "dispatch",
        max_doublings: int = RELAY_MAX_DOUBLINGS,
    ) -> list[str]:
        """Publish again the prepared operations whose message is plausibly lost.

        An operation qualifies when nobody claimed it for `older_than` since its last
        publish; every re-publication doubles that wait (up to 2^`max_doublings`), and
        `publish(op_id, generation)` gets the new generation to carry in the message.

        With `interval` (the relay's) the backlog guard applies: `depth` is the dispatch
        queue's depth now; nothing is published while the queue is deeper than the workers
        drain in two intervals, nor until it has been that shallow for `older_than` (a
        message queued behind a backlog had that long to arrive), and then only into the
        headroom. In one transaction: lock a batch (SKIP LOCKED), publish each, then mark
        them. A crash between publishing and marking only publishes them again later,
        which the fenced claim makes harmless.
        """
        with self._tx() as conn:
            budget = None
            allowed = limit
            if interval is not None:
                counter = int(conn.execute(q.CLAIM_COUNTER).scalar_one())
                budget = self._guard(
                    conn,
                    queue,
                    depth=depth,
                    interval=interval,
                    limit=limit,
                    hold_for=older_than,
                    counter=counter,
                )
                allowed = budget.allowed
            rows: Sequence[Any] = []
            if allowed:
                rows = conn.execute(
                    q.RELAY_CANDIDATES,
                    {"after": older_than, "limit": allowed, "max_doublings": max_doublings},
                ).all()
            for r in rows:
                publish(r.id, r.relay_gen + 1)
            if rows and before_mark is not None:
                before_mark()
            ids = [r.id for r in rows]
            if ids:
                conn.execute(q.MARK_ENQUEUED, {"ids": ids})
            if budget is not None:
                self._save_guard(conn, queue, budget.state, published=len(ids))
        return ids

    def _guard(
        self,
        conn: Connection,
        queue: str,
        *,
        depth: int | None,
        interval: timedelta,
        limit: int,
        hold_for: timedelta = timedelta(0),
        counter: int | None = None,
    ) -> backlog.Plan:
        conn.execute(q.ENSURE_QUEUE_GUARD, {"queue": queue})
        row = conn.execute(q.LOCK_QUEUE_GUARD, {"queue": queue}).one()
        return backlog.plan(
            _guard_state(row),
            depth=depth,
            now=row.now,
            counter=counter,
            interval=interval,
            limit=limit,
            hold_for=hold_for,
        )

    def _save_guard(
        self, conn: Connection, queue: str, state: backlog.GuardState, *, published: int
    ) -> None:
        after = None if state.depth_after is None else state.depth_after + published
        conn.execute(
            q.SAVE_QUEUE_GUARD,
            {
                "queue": queue,
                "sampled_at": state.sampled_at,
                "depth_after": after,
                "counter": state.counter,
                "drain_per_s": state.drain_per_s,
                "shallow_since": state.shallow_since,
            },
        )

    def queue_guard(self, queue: str) -> backlog.GuardState | None:
        """The backlog guard's last sample of `queue` (None before the first guarded run)."""
        with self._single() as conn:
            row = conn.execute(q.SELECT_QUEUE_GUARD, {"queue": queue}).one_or_none()
        return None if row is None else _guard_state(row)

    def purge_payloads(self, *, older_than: timedelta, limit: int = 1000) -> int:
        """Delete frozen payloads of finished operations older than `older_than`.

        The digest, the attempts and the evidence stay.
        """
        with self._single() as conn:
            return len(
                conn.execute(q.PURGE_PAYLOADS, {"older_than": older_than, "limit": limit}).all()
            )

    def due_notifications(self, *, limit: int = 500, backoff: timedelta) -> list[str]:
        """Operations whose open review has not been notified yet; each is handed out
        once per `backoff` until `mark_notified`."""
        with self._single() as conn:
            rows = conn.execute(q.DUE_NOTIFICATIONS, {"limit": limit, "backoff": backoff})
            return [r.op_id for r in rows]

    def mark_notified(self, review_id: int) -> None:
        """Record that the notification of a review is prepared (it is an operation itself)."""
        with self._single() as conn:
            conn.execute(q.MARK_NOTIFIED, {"review_id": review_id})

    # -- cancel ------------------------------------------------------------------------

    def cancel(self, op_id: str, *, reason: str, actor: str = "operator") -> Operation:
        """Cancel a prepared operation before any attempt. Anything else is refused."""
        check_operation_id(op_id)
        check_identifier("reason", reason, max_length=2000)
        check_identifier("actor", actor)
        with self._single() as conn:
            row = conn.execute(
                q.CANCEL, {"op_id": op_id, "actor": actor, "reason": reason}
            ).one_or_none()
            if row is None:
                current = self.get(op_id)
                raise ForbiddenTransition(
                    f"{op_id} is {current.status}; only a prepared operation can be cancelled",
                    op_id=op_id,
                    status=current.status,
                )
        return store.operation(row)

    def list(
        self, *, status: Iterable[Status] | None = None, tenant: str | None = None, limit: int = 100
    ) -> tuple[Operation, ...]:
        """Operations, newest first, optionally filtered by status and tenant."""
        statuses = [Status(s).value for s in status] if status is not None else None
        if tenant is not None:
            tenant = check_key("tenant", tenant)
        with self._single() as conn:
            rows = conn.execute(
                q.LIST_OPERATIONS,
                {"statuses": statuses, "tenant": tenant, "limit": max(1, min(limit, 10_000))},
            )
            return tuple(store.operation(r) for r in rows)


# -- helpers -------------------------------------------------------------------------------

_STATUS_OF = {
    "confirmed": Status.CONFIRMED,
    "rejected": Status.REJECTED,
    "ambiguous": Status.UNKNOWN,
}


#: where the claim's row continues after the operation's columns (queries.CLAIM)
_CLAIM_TAIL = len(q.OPERATION_COLUMNS)


def _payload_limit_from_environment() -> int:
    """`OPLEDGER_MAX_PAYLOAD_BYTES` as the workers read it; only that variable, so an
    unrelated setting cannot stop a ledger from opening."""
    raw = os.environ.get("OPLEDGER_MAX_PAYLOAD_BYTES")
    if raw is None or not raw.strip():
        return DEFAULT_MAX_PAYLOAD_BYTES
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if limit <= 0:
        raise InvalidInput(
            f"OPLEDGER_MAX_PAYLOAD_BYTES must be a positive whole number of bytes, not {raw!r}",
            field="OPLEDGER_MAX_PAYLOAD_BYTES",
        )
    return limit


def _detail_of(outcome: Outcome) -> dict[str, Any]:
    detail = dict(outcome.detail)
    if isinstance(outcome, Confirmed):
        detail.update(receipt_id=outcome.receipt_id, accepted_only=outcome.accepted_only)
    else:
        detail.update(code=outcome.code, reason=outcome.reason)
        if isinstance(outcome, Rejected) and outcome.conflicting_state:
            detail["conflicting_state"] = True
        if isinstance(outcome, Ambiguous):
            detail["replayed"] = outcome.replayed
    return detail


def _reason_of(outcome: Outcome) -> str:
    if isinstance(outcome, Confirmed):
        return "accepted by provider" if outcome.accepted_only else "provider receipt"
    return f"{outcome.kind}: {outcome.code}"


#: the longest trace context `prepare` keeps (a W3C traceparent is 55 characters)
TRACEPARENT_MAX = 256

#: how many operations one operation may run after
MAX_DEPENDENCIES = 100


def _check_after(after: Sequence[str]) -> tuple[str, ...]:
    if isinstance(after, str):
        raise InvalidInput("after must be a list of operation ids, not one string", field="after")
    deps = tuple(sorted({check_operation_id(op_id) for op_id in after}))
    if len(deps) > MAX_DEPENDENCIES:
        raise InvalidInput(
            f"after names {len(deps)} operations; at most {MAX_DEPENDENCIES}", field="after"
        )
    return deps


def _check_scope(scope: Sequence[str]) -> tuple[str, ...]:
    if isinstance(scope, str) or not scope:
        raise InvalidInput("scope must be a non-empty list of action patterns", field="scope")
    patterns = []
    for pattern in scope:
        check_identifier("scope pattern", pattern, max_length=SCOPE_PATTERN_MAX)
        if not all(ch.isalnum() or ch in "._*" for ch in pattern):
            raise InvalidInput(f"scope pattern {pattern!r} has characters other than a-z0-9._*")
        patterns.append(pattern)
    return tuple(patterns)


def _check_grant(grant: Any, *, tenant: str, action: str, ref: str) -> None:
    if grant is None or grant.tenant != tenant:
        raise UnknownAuthorization(f"no authorization {ref!r} for tenant {tenant!r}", ref=ref)
    if not any(fnmatch.fnmatchcase(action, p) for p in grant.scope):
        raise OutOfScope(f"authorization {ref!r} does not cover {action!r}", ref=ref)
    if not grant.active:  # last: a revoked grant that covers the action may still read
        raise AuthorizationRevoked(f"authorization {ref!r} is no longer active", ref=ref)


def _guard_state(row: Any) -> backlog.GuardState:
    return backlog.GuardState(
        sampled_at=row.sampled_at,
        depth_after=row.depth_after,
        counter=row.counter,
        drain_per_s=row.drain_per_s,
        shallow_since=row.shallow_since,
    )
