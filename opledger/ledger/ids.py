"""Opaque operation ids, idempotency keys derived from the intent, and the checks every
caller-supplied identifier goes through."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from datetime import timedelta

from ulid import ULID

from .errors import InvalidIdentifier, InvalidInput, MalformedOperationId, UnknownAction

OP_ID_RE = re.compile(r"^op_[0-9A-HJKMNP-TV-Z]{26}$")
ACTION_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+\.v[1-9][0-9]*$")
MAX_IDENTIFIER_LENGTH = 200
KEY_PREFIX = "opk_"
#: the longest idempotency key opledger sends: a key derived from the intent ("opk_" and 26
#: characters; an operation recorded before keys were derived kept its id, one shorter),
#: with an operator's new-key suffix (".k" and the attempt number, up to 999 attempts)
LONGEST_KEY = len(KEY_PREFIX) + 26 + len(".k999")
#: Crockford's base 32, as ULIDs spell it (no I, L, O, U)
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_operation_id() -> str:
    """A fresh opaque, time-ordered id: 'op_' + ULID. Never derived from customer data."""
    return f"op_{ULID()}"


def intent_idempotency_key(
    namespace: str, *, tenant: str, workflow_id: str, action: str, intent_key: str
) -> str:
    """The idempotency key a provider sees for an intent: "opk_" and 26 characters of
    Crockford base 32 (130 bits of a SHA-256), derived from the ledger's key namespace, the
    tenant, the run, the action and the intent key, and from nothing else.

    The same intent always gets the same key, so an act asked again after the ledger lost
    its record (a failover to a standby that was behind, a restore) reaches the provider
    under the key it already saw. Opaque: no customer data can be read back from it. The
    namespace is the ledger's own (`ledger_identity`), so two ledgers sharing one provider
    account never share a key."""
    parts = json.dumps(
        ["opledger intent key v1", namespace, tenant, workflow_id, action, intent_key],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    number = int.from_bytes(hashlib.sha256(parts.encode()).digest()[:17], "big") >> 6
    letters = []
    for _ in range(26):
        number, digit = divmod(number, 32)
        letters.append(_CROCKFORD[digit])
    return KEY_PREFIX + "".join(reversed(letters))


def new_key_for(key: str, attempt: int) -> str:
    """The key of an operator's retry "with a new key" as attempt `attempt`: the operation's
    own key (never an earlier new key) with ".k" and the attempt's number."""
    return f"{key.split('.k', 1)[0]}.k{attempt}"


def check_operation_id(value: object) -> str:
    """Return `value` if it is a well-formed operation id, else raise MalformedOperationId."""
    if not isinstance(value, str) or not OP_ID_RE.fullmatch(value):
        shown = str(value)[:64]
        raise MalformedOperationId(f"not an operation id: {shown!a}", value=shown)
    return value


def code_point(ch: str) -> str:
    """`ch` as an error message may show it: U+XXXX and its Unicode name, never raw."""
    name = unicodedata.name(ch, "")
    return f"U+{ord(ch):04X} {name}" if name else f"U+{ord(ch):04X}"


def _text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidIdentifier(f"{name} must be text, not {type(value).__name__}", field=name)
    if not value or not value.strip():
        raise InvalidIdentifier(f"{name} must not be empty", field=name)
    return value


def _refuse(name: str, value: str, at: int, why: str) -> InvalidIdentifier:
    ch = value[at]
    return InvalidIdentifier(
        f"{name} contains {code_point(ch)} at index {at}: {why}",
        field=name,
        code_point=f"U+{ord(ch):04X}",
    )


def check_identifier(name: str, value: object, *, max_length: int = MAX_IDENTIFIER_LENGTH) -> str:
    """Return `value` if it is a usable identifier (non-empty text, bounded, printable)."""
    text = _text(name, value)
    if len(text) > max_length:
        raise InvalidIdentifier(
            f"{name} is {len(text)} characters; the limit is {max_length}", field=name
        )
    for at, ch in enumerate(text):
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise _refuse(name, text, at, "control and surrogate characters are refused")
    return text


def check_text(name: str, value: object, *, max_length: int = 4000) -> str:
    """Free text a person wrote (a review's note, evidence they cite): like
    `check_identifier`, but line breaks are kept. CRLF and CR become LF; every other
    control character is refused."""
    text = _text(name, value).replace("\r\n", "\n").replace("\r", "\n")
    if len(text) > max_length:
        raise InvalidIdentifier(
            f"{name} is {len(text)} characters; the limit is {max_length}", field=name
        )
    for at, ch in enumerate(text):
        if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cs"):
            raise _refuse(name, text, at, "control and surrogate characters are refused")
    return text


def evidence_text(value: object, *, max_length: int = MAX_IDENTIFIER_LENGTH) -> str | None:
    """An id someone else chose (a model's tool-call id, an MCP request id), kept as
    evidence only: as text, control characters replaced by "?", cut to `max_length`.
    Never refused: what a caller's transport put in its ids must not fail the call."""
    if value is None:
        return None
    text = "".join("?" if unicodedata.category(ch) in ("Cc", "Cs") else ch for ch in str(value))
    return text[:max_length] if text.strip() else None


# Default_Ignorable_Code_Point, as DerivedCoreProperties.txt defines it:
#   Other_Default_Ignorable_Code_Point + Cf + Variation_Selector
#   - White_Space - FFF9..FFFB - 13430..1343F - Prepended_Concatenation_Mark
# unicodedata gives the general category; the three short lists below are PropList.txt's
# (Unicode 14.0, Python 3.11's), ranges inclusive. tests/unit/test_identifiers.py compares
# the result with the derived list Unicode publishes, for every code point.
OTHER_DEFAULT_IGNORABLE = (
    (0x034F, 0x034F),  # COMBINING GRAPHEME JOINER
    (0x115F, 0x1160),  # HANGUL CHOSEONG FILLER, HANGUL JUNGSEONG FILLER
    (0x17B4, 0x17B5),  # KHMER VOWEL INHERENT AQ, AA
    (0x2065, 0x2065),  # reserved, among the invisible operators
    (0x3164, 0x3164),  # HANGUL FILLER
    (0xFFA0, 0xFFA0),  # HALFWIDTH HANGUL FILLER
    (0xFFF0, 0xFFF8),  # reserved, before the specials
    (0xE0000, 0xE0000),  # reserved, around the tags and variation selectors:
    (0xE0002, 0xE001F),
    (0xE0080, 0xE00FF),
    (0xE01F0, 0xE0FFF),
)
VARIATION_SELECTORS = (
    (0x180B, 0x180D),  # MONGOLIAN FREE VARIATION SELECTOR ONE..THREE
    (0x180F, 0x180F),  # MONGOLIAN FREE VARIATION SELECTOR FOUR
    (0xFE00, 0xFE0F),  # VARIATION SELECTOR-1..16
    (0xE0100, 0xE01EF),  # VARIATION SELECTOR-17..256
)
#: format characters that are not default-ignorable (identifiers refuse them all the same)
VISIBLE_FORMAT = (
    (0x0600, 0x0605),  # Prepended_Concatenation_Mark: Arabic number signs ...
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0xFFF9, 0xFFFB),  # interlinear annotation controls
    (0x13430, 0x1343F),  # Egyptian hieroglyph format controls
)
#: a letter or symbol by category that prints as nothing, yet no property says so
BLANK = frozenset("\u2800")  # BRAILLE PATTERN BLANK
#: a code point's canonical decomposition is at most this long, so a text longer than this
#: many times a limit cannot be within it once composed (NFC)
MAX_DECOMPOSITION = 4


def _code_points(*lists: tuple[tuple[int, int], ...]) -> frozenset[int]:
    return frozenset(cp for ranges in lists for low, high in ranges for cp in range(low, high + 1))


_IGNORABLE_BESIDES_FORMAT = _code_points(OTHER_DEFAULT_IGNORABLE, VARIATION_SELECTORS)
_VISIBLE_FORMAT = _code_points(VISIBLE_FORMAT)


def default_ignorable(ch: str) -> bool:
    """True if `ch` has the Unicode property Default_Ignorable_Code_Point: a character
    that renders as nothing where it is not supported (zero-width, bidi, joiners,
    variation selectors, fillers, tags, and code points reserved for more of them)."""
    cp = ord(ch)
    included = unicodedata.category(ch) == "Cf" or cp in _IGNORABLE_BESIDES_FORMAT
    return included and cp not in _VISIBLE_FORMAT and not ch.isspace()


def _unreadable(ch: str) -> str | None:
    """Why a key may not contain `ch`, or None."""
    category = unicodedata.category(ch)
    if category in ("Cc", "Cs"):
        return "control and surrogate characters are refused"
    if default_ignorable(ch) or ch in BLANK:
        return "a character that renders as nothing is refused"
    if category == "Cf":
        return "format characters are refused"
    if category in ("Zl", "Zp"):
        return "line and paragraph separators are refused"
    if category == "Co":
        return "private-use characters are refused (no agreed glyph)"
    if category == "Cn":
        return "unassigned code points are refused"
    return None


def check_key(name: str, value: object, *, max_length: int = MAX_IDENTIFIER_LENGTH) -> str:
    """An identifier that names something (tenant, workflow, intent key, target), in NFC.

    Two spellings of one text (NFC and NFD "café") are one name: the value is normalised
    to NFC before it is stored or compared, and `max_length` counts the NFC form. Refused,
    since they would make two names look like one: every default-ignorable code point
    (zero-width, bidi, joiners, variation selectors, fillers, tags), every other format
    or control character, line separators, private-use characters (no agreed glyph),
    unassigned code points (they have no glyph yet, and NFC is only stable for assigned
    ones), a combining mark with no base before it, and leading or trailing white space.
    """
    text = _text(name, value)
    if len(text) > MAX_DECOMPOSITION * max_length:
        raise InvalidIdentifier(
            f"{name} is {len(text)} characters; the limit is {max_length}", field=name
        )
    for at, ch in enumerate(text):
        why = _unreadable(ch)
        if why is not None:
            raise _refuse(name, text, at, why)
    normal = unicodedata.normalize("NFC", text)
    if len(normal) > max_length:
        raise InvalidIdentifier(
            f"{name} is {len(normal)} characters in NFC; the limit is {max_length}", field=name
        )
    if unicodedata.category(normal[0]).startswith("M"):
        raise _refuse(name, normal, 0, "a combining mark needs a character before it")
    if normal != normal.strip():
        raise InvalidIdentifier(f"{name} has leading or trailing white space", field=name)
    return normal


def check_operator(name: str, value: object, *, max_length: int = 120) -> str:
    """A person's name in the audit trail: what `check_key` accepts and only printable
    characters (no space but U+0020), in NFC, so no name can pass for another one."""
    normal = check_key(name, value, max_length=max_length)
    for at, ch in enumerate(normal):
        if not ch.isprintable():
            raise _refuse(name, normal, at, "characters that do not print are refused")
    return normal


def check_action(value: object) -> str:
    """Return `value` if it looks like a versioned action such as ``crm.close_case.v1``."""
    check_identifier("action", value, max_length=120)
    assert isinstance(value, str)
    if not ACTION_RE.fullmatch(value):
        raise UnknownAction(
            f"not a versioned action name: {value!a} (expected e.g. 'crm.close_case.v1')",
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
