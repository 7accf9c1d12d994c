"""Opaque operation ids and the checks every caller-supplied identifier goes through."""

from __future__ import annotations

import re
import unicodedata
from datetime import timedelta

from ulid import ULID

from .errors import InvalidIdentifier, InvalidInput, MalformedOperationId, UnknownAction

OP_ID_RE = re.compile(r"^op_[0-9A-HJKMNP-TV-Z]{26}$")
ACTION_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+\.v[1-9][0-9]*$")
MAX_IDENTIFIER_LENGTH = 200
#: the longest idempotency key opledger sends: an operation id, or one with an operator's
#: new-key suffix (".k" and the attempt number, up to 999 attempts)
LONGEST_KEY = len("op_") + 26 + len(".k999")


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


def evidence_text(value: object, *, max_length: int = MAX_IDENTIFIER_LENGTH) -> str | None:
    """An id someone else chose (a model's tool-call id, an MCP request id), kept as
    evidence only: as text, control characters replaced by "?", cut to `max_length`.
    Never refused: what a caller's transport put in its ids must not fail the call."""
    if value is None:
        return None
    text = "".join("?" if unicodedata.category(ch) in ("Cc", "Cs") else ch for ch in str(value))
    return text[:max_length] if text.strip() else None


#: characters that render as nothing although Unicode calls them letters or symbols
INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0\u2800\u180e")


def _invisible(ch: str) -> bool:
    return unicodedata.category(ch) == "Cf" or ch in INVISIBLE


def check_key(name: str, value: object, *, max_length: int = MAX_IDENTIFIER_LENGTH) -> str:
    """An identifier that names something (tenant, workflow, intent key, target), in NFC.

    Two spellings of one text (NFC and NFD "café") are one name: the value is normalised
    to NFC before it is stored or compared. Invisible format characters (zero-width
    spaces and joiners, bidi controls) are refused: they make two names look like one.
    """
    check_identifier(name, value, max_length=max_length)
    assert isinstance(value, str)
    if any(_invisible(ch) for ch in value):
        raise InvalidIdentifier(
            f"{name} contains invisible characters (zero-width, bidi or filler)", field=name
        )
    normal = unicodedata.normalize("NFC", value)
    if len(normal) > max_length:
        raise InvalidIdentifier(
            f"{name} is {len(normal)} characters; the limit is {max_length}", field=name
        )
    return normal


def check_operator(name: str, value: object, *, max_length: int = 120) -> str:
    """A person's name in the audit trail: printable, visible characters only, in NFC.

    Refused: control, format (zero-width, bidi) and other non-printable characters, blank
    fillers, and leading or trailing spaces, so no name can pass for another one.
    """
    normal = check_key(name, value, max_length=max_length)
    if normal != normal.strip():
        raise InvalidIdentifier(f"{name} has leading or trailing spaces", field=name)
    if not all(ch.isprintable() for ch in normal):
        raise InvalidIdentifier(f"{name} contains characters that do not print", field=name)
    return normal


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


def parse_age(text: str) -> timedelta:
    """An age as an operator types it — '90s', '15m', '2h', '3d' — or `InvalidInput`
    (negative, not a number, another unit)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip()
    try:
        amount = float(text[:-1])
        if amount < 0 or amount != amount:
            raise ValueError(text)
        return timedelta(seconds=amount * units[text[-1]])
    except (KeyError, ValueError, IndexError, OverflowError):
        raise InvalidInput(
            f"age {text!r}: use a number and s, m, h or d (e.g. 2h)", field="age"
        ) from None
