"""The ledger's base: its engine, store and limits, and the reads every part of its API uses."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any, Protocol

from sqlalchemy import Engine

from . import queries as q
from . import store
from .approval_policy import Requirement, parse_policy, requirement
from .canonical import DEFAULT_MAX_PAYLOAD_BYTES, CanonicalPayload
from .errors import (
    InvalidInput,
    OperationNotFound,
)
from .ids import (
    check_action,
    check_operation_id,
)
from .models import (
    Answer,
    History,
    Operation,
)
from .payload_keys import PayloadKeys
from .payload_schemas import PayloadSchemas
from .store import Store

#: how long a claim may start its request when no provider-specific window is given
DEFAULT_SEND_WINDOW = timedelta(seconds=10)


class ActionResolver(Protocol):
    """Says which provider serves an action, or raises `UnknownAction`.

    A resolver may also declare what makes another act of an action, as
    `intent_fields(action) -> tuple[str, ...]` (the adapter registry does): the payload
    fields an agent's intent is derived from (`opledger.ledger.intents`). Without it,
    `Ledger.intent_fields` raises `IntentFieldsUndeclared`. It may declare each action's
    payload schema too, as `payload_schema(action) -> JSON Schema`: `prepare` refuses a
    payload that breaks it (`opledger.ledger.payload_schemas`); and its approval policy, as
    `approval_policy(action) -> policy`: an act the policy requires approval of waits for a
    person (`opledger.ledger.approval_policy`, `opledger.ledger.approvals`)."""

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


class LedgerBase:
    """What every part of the ledger's API shares: the engine and store, the action resolver
    and the limits; and the reads."""

    def __init__(
        self,
        engine: Engine,
        *,
        actions: ActionResolver | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        send_window: timedelta = DEFAULT_SEND_WINDOW,
        schema: str | None = None,
        payload_keys: PayloadKeys | None = None,
    ) -> None:
        """A ledger on `engine`, in Postgres schema `schema` (default: the schema the
        engine already serves, else `OPLEDGER_DATABASE_SCHEMA`, else `opledger`).
        `payload_keys` encrypt the frozen payloads it writes and decrypt those it reads
        (`opledger.ledger.payload_keys`); without them payloads are written in clear.

        The engine becomes the ledger's: every connection it opens from now on runs with
        the ledger's schema as its whole `search_path`. Keep your application's tables on
        an engine of their own; to prepare inside your own transaction, pass its session
        (`prepare(..., session=...)`), which keeps your `search_path` as it was."""
        if send_window <= timedelta(0):
            raise InvalidInput("send_window must be positive", field="send_window")
        self.engine = engine
        self._store = Store(engine, schema, payload_keys)
        self.schema = self._store.schema
        self._tx = self._store.transaction
        self._single = self._store.statement
        self.actions: ActionResolver = actions or PrefixResolver()
        self.max_payload_bytes = max_payload_bytes
        # the action resolver's payload schemas (the adapter registry's), checked by prepare
        schema_of = getattr(self.actions, "payload_schema", None)
        self.payload_schemas = PayloadSchemas(schema_of if callable(schema_of) else None)
        # the action resolver's approval policies (the adapter registry's), read by prepare
        policy_of = getattr(self.actions, "approval_policy", None)
        self._approval_policy = policy_of if callable(policy_of) else None
        self.send_window = send_window

    def approval_requirement(
        self, action: str, target: str, frozen: CanonicalPayload
    ) -> Requirement | None:
        """What approval the act on `target` with the `frozen` payload needs before it is
        sent, as its action's policy (the resolver's `approval_policy`) decides; None when
        none (no policy declared: never)."""
        if self._approval_policy is None:
            return None
        policy = parse_policy(action, self._approval_policy(action))
        if not policy.tiers:
            return None
        return requirement(policy, target, frozen.loads() if policy.reads_payload else {})

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
            value = self._store.payload(conn, op_id)
        if value is None:
            self.get(op_id)
        return value

    def answers(self, op_ids: Iterable[str]) -> dict[str, Answer]:
        """How each of `op_ids` stands, as agents waiting on them are answered, read in one
        statement: by id, without the ids that name no operation. For one thread reading
        for many waiters (the settle listener's): a prepared statement on a connection kept
        for it (`Store.hot_rows`), one round trip."""
        ids = sorted({check_operation_id(op_id) for op_id in op_ids})
        if not ids:
            return {}
        rows = self._store.hot_rows(q.SELECT_ANSWERS, {"ids": ids})
        answers = (self._store.answer(row) for row in rows)
        return {answer.operation.id: answer for answer in answers}

    def answer(self, op_id: str) -> Answer:
        """How `op_id` stands, as an agent waiting on it is answered (`answers`), read in
        one statement on the pool's connections (any number of threads)."""
        check_operation_id(op_id)
        with self._single() as conn:
            row = conn.execute(q.SELECT_ANSWERS, {"ids": [op_id]}).one_or_none()
        if row is None:
            raise OperationNotFound(f"no operation {op_id}", op_id=op_id)
        return self._store.answer(tuple(row))

    def history(self, op_id: str) -> History:
        """Everything recorded about `op_id`: attempts, evidence, transitions and reviews."""
        check_operation_id(op_id)
        with self._store.snapshot() as conn:
            return self._store.history(conn, op_id)
