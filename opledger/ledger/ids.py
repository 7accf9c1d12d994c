"""Opaque operation ids and the checks every caller-supplied identifier goes through."""

from __future__ import annotations

import re
import unicodedata

from ulid import ULID

from .errors import InvalidIdentifier, MalformedOperationId, UnknownAction

OP_ID_RE = re.compile(r"^op_[0-9A-HJKMNP-TV-Z]{26}$")
ACTION_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+\.v[1-9][0-9]*$")
MAX_IDENTIFIER_LENGTH = 200


def new_operation_id() -> str:
    """A fresh opaque, time-ordered id: 'op_' + ULID. Never derived from customer data."""
    return f"op_{ULID()}"


def check_operation_id(value: object) -> str:
    """Return `value` if it is a well-formed operation id, else raise MalformedOperationId."""
    if not isinstance(value, str) or not OP_ID_RE.fullmatch(value):
        raise MalformedOperationId(
            f"not an operation id: {str(value)[:64]!r}", value=str(value)[:64]
        )
    return value


def check_identifier(name: str, value: object, *, max_length: int = MAX_IDENTIFIER_LENGTH) -> str:
    """Return `value` if it is a usable identifier (non-empty text, bounded, printable)."""
    if not isinstance(value, str):
        raise InvalidIdentifier(f"{name} must be text, not {type(value).__name__}", field=name)
    if not value or not value.strip():
        raise InvalidIdentifier(f"{name} must not be empty", field=name)
    if len(value) > max_length:
        raise InvalidIdentifier(
            f"{name} is {len(value)} characters; the limit is {max_length}", field=name
        )
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in value):
        raise InvalidIdentifier(f"{name} contains control or surrogate characters", field=name)
    return value


def check_action(value: object) -> str:
    """Return `value` if it looks like a versioned action such as ``crm.close_case.v1``."""
    check_identifier("action", value, max_length=120)
    assert isinstance(value, str)
    if not ACTION_RE.fullmatch(value):
        raise UnknownAction(
            f"not a versioned action name: {value!r} (expected e.g. 'crm.close_case.v1')",
            action=value,
        )
    return value
