"""An action's declared payload schema, checked when an act is recorded.

An adapter declares the JSON Schema of each action's payload (`payload_schemas`; the
registry gives it as `payload_schema(action)`). `prepare` checks the frozen payload against
it before anything is written, so every path that records an act — `effect()`, the
LangGraph and other agent tools, the CLI, the MCP gateway — refuses a payload the action
does not take with one typed error, `PayloadSchemaViolation`, naming the field. A resolver
that declares no schema (the default `PrefixResolver`) leaves payloads unchecked; so does
an action whose adapter declares none (any JSON object).

What is checked is the canonical payload (`CanonicalPayload.loads`): the JSON the ledger
freezes and the provider is sent, not the caller's Python objects.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from .errors import PayloadSchemaViolation

__all__ = ["PayloadSchemaViolation", "PayloadSchemas", "check_schema"]

#: how many problems one refusal names
MAX_PROBLEMS = 5
#: the schema that checks nothing a canonical payload could break (it is always an object)
_ANY_OBJECT = {"type": "object"}


def check_schema(action: str, schema: Mapping[str, Any]) -> None:
    """Raise `ValueError` naming `action` when `schema` is not a valid JSON Schema (Draft
    2020-12) of an object: an adapter's mistake is found when it is registered, not at
    its first payload."""
    if schema.get("type") != "object":
        raise ValueError(f"the payload schema of {action} must be a JSON Schema object")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ValueError(f"the payload schema of {action} is not valid: {exc.message}") from None


def _where(error: ValidationError) -> str:
    return ".".join(["payload", *(str(p) for p in error.absolute_path)])


class PayloadSchemas:
    """The validators of a resolver's schemas, each built once per action (and again if
    the resolver's schema for it changes)."""

    def __init__(self, schema_of: Callable[[str], Mapping[str, Any]] | None) -> None:
        self._schema_of = schema_of
        self._lock = threading.Lock()
        self._validators: dict[str, tuple[Mapping[str, Any], Draft202012Validator]] = {}

    def _validator(self, action: str) -> Draft202012Validator | None:
        if self._schema_of is None:
            return None
        schema = self._schema_of(action)
        if schema == _ANY_OBJECT:
            return None
        with self._lock:
            known = self._validators.get(action)
            if known is None or known[0] != schema:
                known = (dict(schema), Draft202012Validator(schema))
                self._validators[action] = known
            return known[1]

    def check(self, action: str, payload: Callable[[], Mapping[str, Any]]) -> None:
        """Raise `PayloadSchemaViolation` when `payload()` (read only when there is a schema
        to check) breaks `action`'s schema; its `field` is the first problem's place
        (`payload.amount`), its `problems` every one named (at most `MAX_PROBLEMS`)."""
        validator = self._validator(action)
        if validator is None:
            return
        errors = sorted(
            validator.iter_errors(payload()), key=lambda e: [str(p) for p in e.absolute_path]
        )
        if not errors:
            return
        problems = [f"{_where(e)}: {e.message[:300]}" for e in errors[:MAX_PROBLEMS]]
        raise PayloadSchemaViolation(
            f"the payload does not fit {action}'s schema: {'; '.join(problems)}",
            field=_where(errors[0]),
            action=action,
            problems=tuple(problems),
        )
