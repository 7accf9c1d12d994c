"""Prepare and ask: an intended effect recorded before anything crosses the boundary,
idempotent per intent; its dependencies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, TextClause
from sqlalchemy.orm import Session

from . import queries as q
from . import store
from .approval_policy import Requirement
from .approvals import Approvals
from .canonical import CanonicalPayload, canonicalize
from .errors import (
    AuthorizationRevoked,
    DatabaseUnavailable,
    DependencyCycle,
    IntentConflict,
    IntentFieldsUndeclared,
    InvalidInput,
    PayloadSchemaViolation,
    UnknownDependency,
)
from .grants import _check_grant
from .ids import (
    check_action,
    check_identifier,
    check_key,
    check_operation_id,
    evidence_text,
    intent_idempotency_key,
    new_operation_id,
)
from .intents import RUN, TENANT, Intent, check_fields, check_scope, tenant_wide
from .models import (
    Ask,
    Asked,
    Dependency,
    Operation,
    Status,
)
from .payload_keys import sealed_columns


@dataclass(frozen=True)
class _Recording:
    """An intent checked, frozen and keyed: the columns its operation is inserted with
    (`values`, but the id and the payload), and what a replay of it is compared with."""

    values: dict[str, Any]
    frozen: CanonicalPayload
    #: the operations it runs after, checked and sorted
    deps: tuple[str, ...]
    #: the approval its action's policy requires before it is sent (None: none)
    approval: Requirement | None = None

    @property
    def names(self) -> dict[str, str]:
        """What names the intent: its tenant, workflow and intent key."""
        return {k: self.values[k] for k in ("tenant", "workflow_id", "intent_key")}

    @property
    def lookup(self) -> TextClause:
        """The statement that finds the operation already recorded under the intent: a
        run's act in its run, a tenant-wide act in its tenant (whatever run asked it)."""
        if self.values["intent_scope"] == TENANT:
            return q.SELECT_OPERATION_BY_TENANT_INTENT
        return q.SELECT_OPERATION_BY_INTENT

    @property
    def asking(self) -> bool:
        """Recorded by `ask` (answered when it names a recorded intent), not `prepare`."""
        return bool(self.values["record_ask"])


class Prepare(Approvals):
    """Recording intents: `prepare`, `ask`, their dependencies and who asked."""

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
        same operation. The key is yours: it names an act of the run `workflow_id`, whatever
        scope the action declares (a tenant-wide act is keyed by `ask_intent`). The same
        intent with another action, target, payload, authorization or `after` raises
        `IntentConflict`. `tenant`, `workflow_id`, `intent_key` and `target` are normalised
        to Unicode NFC (an NFD spelling names the same operation) and may not contain
        invisible characters. With `session=`, the
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
        intent = Intent(
            tenant=tenant,
            workflow_id=workflow_id,
            intent_key=intent_key,
            action=action,
            target=target,
            payload=payload,
            authorization_ref=authorization_ref,
            after=after,
        )
        recording = self._recording(
            intent, actor=actor, notify=notify, traceparent=traceparent, asking=False
        )
        return self._prepare(recording, session).operation

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
        `intent_key` from the act (`opledger.ledger.intents.intent_key`), or give the act
        itself to `ask_intent`. As with `prepare`, a key of your own names an act of the run
        `workflow_id`."""
        intent = Intent(
            tenant=tenant,
            workflow_id=workflow_id,
            intent_key=intent_key,
            action=action,
            target=target,
            payload=payload,
            authorization_ref=authorization_ref,
            asked_by=asked_by,
            after=after,
        )
        recording = self._recording(
            intent, actor=actor, notify=notify, traceparent=traceparent, asking=True
        )
        return self._prepare(recording, None)

    def ask_intent(
        self,
        intent: Intent,
        *,
        actor: str = "agent",
        notify: bool = False,
        traceparent: str | None = None,
    ) -> Asked:
        """`ask` for an `Intent` record, keyed by the act unless it names its own
        `intent_key` (`Intent.keyed`: raises `IntentFieldsUndeclared` where the intent
        fields are neither given nor declared), in the action's scope (`intent_scope`).

        An act of the tenant's scope asked from any run of the tenant is answered with the
        operation the first ask recorded (its `workflow_id` is that run), as an act asked
        again in its own run is: under the asker's grant, checked first (another tenant's,
        or one that does not cover the action, is refused, never answered), with what this
        ask asked differently named and never sent."""
        keyed = intent.keyed(self.intent_fields, self.intent_scope)
        recording = self._recording(
            keyed, actor=actor, notify=notify, traceparent=traceparent, asking=True
        )
        return self._prepare(recording, None)

    def asks(self, op_id: str) -> tuple[Ask, ...]:
        """Every ask of `op_id`'s intent through `ask`, oldest first (none for what only
        `prepare` recorded: it keeps no asks)."""
        check_operation_id(op_id)
        with self._single() as conn:
            rows = conn.execute(q.SELECT_ASKS, {"op_id": op_id}).all()
        if not rows:
            self.get(op_id)
        return tuple(store.record(Ask, r) for r in rows)

    def _recording(
        self, intent: Intent, *, actor: str, notify: bool, traceparent: str | None, asking: bool
    ) -> _Recording:
        """`intent` checked (its names in NFC, without invisible characters), its payload
        frozen, its idempotency key derived: what recording it inserts."""
        tenant = check_key("tenant", intent.tenant)
        if traceparent is not None:
            check_identifier("traceparent", traceparent, max_length=TRACEPARENT_MAX)
        workflow_id = check_key("workflow_id", intent.workflow_id)
        intent_key = check_key("intent_key", intent.intent_key)
        scope = _check_scope(intent.scope, intent_key)
        target = check_key("target", intent.target)
        action, authorization_ref = intent.action, intent.authorization_ref
        check_identifier("authorization_ref", authorization_ref)
        check_action(action)
        deps = _check_after(intent.after)
        provider = self.actions.provider_for(action)
        frozen = canonicalize(intent.payload, max_bytes=self.max_payload_bytes)
        approval = self.approval_requirement(action, target, frozen)
        # derived from the intent, never random: asked again after the ledger lost its
        # record (a failover, a restore), the act reaches the provider under the same key —
        # a tenant-wide act under the same key whatever run asks it then (no run is "")
        key = intent_idempotency_key(
            self._store.key_namespace(),
            tenant=tenant,
            workflow_id=workflow_id if scope == RUN else "",
            action=action,
            intent_key=intent_key,
        )
        values: dict[str, Any] = {
            "tenant": tenant,
            "workflow_id": workflow_id,
            "intent_key": intent_key,
            "intent_scope": scope,
            "action": action,
            "target": target,
            "provider": provider,
            "payload_digest": frozen.digest,
            "payload_size": frozen.size,
            "authorization_ref": authorization_ref,
            "actor": actor,
            "waiting_on": 0,
            "notify_settle": notify,
            "traceparent": traceparent,
            "asked_by": evidence_text(intent.asked_by) if asking else None,
            "record_ask": asking,
            "idempotency_key": key,
        }
        return _Recording(values=values, frozen=frozen, deps=deps, approval=approval)

    def _prepare(self, recording: _Recording, session: Session | None) -> Asked:
        """Record the checked intent (in the caller's transaction with `session`), or answer
        with the operation already recorded under it."""
        try:
            # the action's declared schema, checked only for what would be a new
            # operation: an ask of an act already recorded is answered with it (`differs`
            # naming the payload), never refused as if nothing had been done
            self.payload_schemas.check(recording.values["action"], recording.frozen.loads)
            misfit: PayloadSchemaViolation | None = None
        except PayloadSchemaViolation as exc:
            misfit = exc
        fast = misfit is None and recording.approval is None
        if session is None and not recording.deps and fast:
            # a new intent under a good grant: recorded in one statement (one round trip);
            # anything else takes the full path below, which says what it was. So does a
            # kept connection found broken (a restarted server): the insert is of an intent,
            # so the full path finds it if it did commit.
            try:
                fresh = self._insert_granted(recording.values, recording.frozen.text)
            except DatabaseUnavailable:
                fresh = None
            if fresh is not None:
                return Asked(operation=fresh, first=True)
        with self._tx(session) as conn:
            return self._granted(conn, recording, misfit)

    def _granted(
        self, conn: Connection, recording: _Recording, misfit: PayloadSchemaViolation | None
    ) -> Asked:
        """The intent recorded under its grant, or the operation it already names; a new
        one waits on its dependencies (locked). A payload that does not fit the action's
        schema (`misfit`) is refused unless its intent is recorded already."""
        values = recording.values
        ref, tenant = values["authorization_ref"], values["tenant"]
        grant = conn.execute(q.SELECT_AUTHORIZATION, {"ref": ref}).one_or_none()
        try:
            _check_grant(grant, tenant=tenant, action=values["action"], ref=ref)
        except AuthorizationRevoked:
            # an ask of an intent already recorded reads what was done: no new write is
            # made under this grant, the tenant's, covering the action (checked first)
            recorded = self._recorded(conn, recording) if recording.asking else None
            if recorded is None:
                raise
            return recorded
        if misfit is not None:
            recorded = self._recorded(conn, recording)
            if recorded is None:
                raise misfit
            return recorded
        blocking, doomed = 0, None
        if recording.deps:
            recorded = self._recorded(conn, recording)
            if recorded is not None:  # a replayed ask: lock nothing, insert nothing
                return recorded
            blocking, doomed = self._lock_dependencies(conn, tenant, recording.deps)
        op_id = new_operation_id()
        values = {
            **values,
            "id": op_id,
            # sealed under the current key (if any); the digest is the clear text's
            **sealed_columns(self._store.payload_keys, op_id, recording.frozen.text),
            # an act a person must approve first waits for them too (`approvals`)
            "waiting_on": blocking + (recording.approval is not None),
        }
        return self._insert(conn, values, recording, doomed)

    def _insert_granted(self, values: dict[str, Any], canonical: str) -> Operation | None:
        """The new operation, inserted in one statement if its grant allows it and its
        intent is new (`queries.INSERT_GRANTED_OPERATION`); None otherwise."""
        op_id = new_operation_id()
        row = self._store.hot(
            q.INSERT_GRANTED_OPERATION,
            {
                **values,
                "id": op_id,
                **sealed_columns(self._store.payload_keys, op_id, canonical),
            },
        )
        return None if row is None else store.operation_of(row)

    def _recorded(self, conn: Connection, recording: _Recording) -> Asked | None:
        """The intent as already recorded, answered as an ask of it; None if it is new."""
        row = conn.execute(recording.lookup, recording.names).one_or_none()
        return None if row is None else self._same_intent(conn, store.operation(row), recording)

    def _insert(
        self,
        conn: Connection,
        values: dict[str, Any],
        recording: _Recording,
        doomed: str | None,
    ) -> Asked:
        """Insert the new operation with its payload, ask and dependencies; a dependency
        already rejected or cancelled (`doomed`) cancels it at once."""
        row = conn.execute(q.INSERT_OPERATION, values).one_or_none()
        if row is None:  # another caller inserted the same intent just now
            row = conn.execute(recording.lookup, recording.names).one_or_none()
            if row is None:  # a row of the other scope under this key (one of old: refused)
                raise IntentConflict(
                    f"intent {values['intent_key']!r} of workflow {values['workflow_id']!r} "
                    "already names an operation of another intent scope",
                    differs=("intent_scope",),
                )
            return self._same_intent(conn, store.operation(row), recording)
        op_id = values["id"]
        if recording.deps:
            conn.execute(q.INSERT_DEPENDENCIES, {"op_id": op_id, "after": list(recording.deps)})
        if recording.approval is not None and doomed is None:  # bound to the row as inserted
            conn.execute(
                q.INSERT_APPROVAL,
                self.approval_params(
                    op_id,
                    recording.approval,
                    requested_by=values["actor"],
                    asked_by=values["asked_by"],
                ),
            )
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

    def _same_intent(self, conn: Connection, existing: Operation, recording: _Recording) -> Asked:
        """The operation a replayed prepare (or a repeated ask) names. `prepare` refuses
        another action, target, payload, authorization or `after` (`IntentConflict`); an
        ask is answered with the recorded operation and what it asked differently."""
        values, deps = recording.values, recording.deps
        names = ("action", "target", "payload_digest", "authorization_ref")
        differs = [n for n in names if getattr(existing, n) != values[n]]
        recorded = set(conn.execute(q.SELECT_DEPENDENCY_IDS, {"op_id": existing.id}).scalars())
        if recorded != set(deps):
            if (
                not recording.asking
                and deps
                and conn.execute(
                    q.REACHES, {"after": list(deps), "op_id": existing.id}
                ).scalar_one()
            ):
                raise DependencyCycle(
                    f"{existing.id} ({existing.workflow_id} / {existing.intent_key}) cannot "
                    "run after operations that run after it, or after itself",
                    op_id=existing.id,
                )
            differs.append("after")
        if differs and not recording.asking:
            raise IntentConflict(
                f"intent {existing.intent_key!r} of workflow {existing.workflow_id!r} already "
                f"names operation {existing.id} with a different {', '.join(differs)}",
                op_id=existing.id,
                differs=tuple(differs),
            )
        if recording.asking:
            conn.execute(
                q.INSERT_ASK,
                {
                    "op_id": existing.id,
                    **{
                        k: values[k]
                        for k in ("asked_by", "actor", "payload_digest", "authorization_ref")
                    },
                    "differs": differs,
                },
            )
        if values["notify_settle"]:
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
                "opledger.tasks.app.runtime().ledger is), or give intent_fields= (or intent_key=)"
            )
        return check_fields(declared(action))

    def intent_scope(self, action: str) -> str:
        """How wide an act of `action` is — `run` (one act per run) or `tenant` (one act
        whatever run of the tenant asks) — as the action resolver (the adapter registry:
        the adapter's `intent_scopes`, or the deployment's `OPLEDGER_INTENT_SCOPES`)
        declares it; `run` where it declares none."""
        declared = getattr(self.actions, "intent_scope", None)  # a resolver of your own
        return RUN if not callable(declared) else check_scope(declared(action))


#: the longest trace context `prepare` keeps (a W3C traceparent is 55 characters)
TRACEPARENT_MAX = 256

#: how many operations one operation may run after
MAX_DEPENDENCIES = 100


def _check_scope(scope: str | None, intent_key: str) -> str:
    """The scope of an intent under `intent_key`: a run's (no scope given) or a tenant's,
    whose key has a form of its own (`intents.tenant_wide`) that no run's key may take, so
    an act of one scope can never answer an ask of the other."""
    chosen = RUN if scope is None else check_scope(scope, field="scope")
    if (chosen == TENANT) != tenant_wide(intent_key):
        raise InvalidInput(
            "a tenant-wide act is named by the key derived from it (ask_intent): "
            f"{intent_key!r} is not such a key"
            if chosen == TENANT
            else f"{intent_key!r} has the form of a tenant-wide act's key, which only "
            "ask_intent derives: name an act of your run with another key",
            field="intent_key",
        )
    return chosen


def _check_after(after: Sequence[str]) -> tuple[str, ...]:
    if isinstance(after, str):
        raise InvalidInput("after must be a list of operation ids, not one string", field="after")
    deps = tuple(sorted({check_operation_id(op_id) for op_id in after}))
    if len(deps) > MAX_DEPENDENCIES:
        raise InvalidInput(
            f"after names {len(deps)} operations; at most {MAX_DEPENDENCIES}", field="after"
        )
    return deps
