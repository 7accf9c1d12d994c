"""What in a recorded document is a secret: a key by the words of its name, a value by its
shape. Pure functions over JSON-like data; whoever shows a payload, a provider's response,
evidence or a result to a person (the console, the CLI, a review notification) passes it
through `scrub` first.

By name: a key is split into words (`cardNumber`, `card_number`, `card-number`, `CARD.NUMBER`
all give `card`, `number`; a plural counts as its singular) and is secret when one word is in
`SECRET_WORDS`, or two adjacent words are a pair in `SECRET_PAIRS` (`api` `key`, `card`
`number`). The parent's last word comes first, so `card: {number: ...}` is `card` `number`.
A secret key hides its whole value, an object or a list included, except a boolean or a null
(one bit, or nothing, is no secret) and a tally: a number under a name with a counting word
(`token_count`, `max_tokens`, `total_tokens`, `sessions_used`).

By shape, whatever the key (`SHAPES`): a card number (13 to 19 digits, spaces or dashes
between groups allowed, first digit 2 to 6 as the card networks issue them, passing the Luhn
check), an HTTP authorization value (`Bearer ...`, `Basic ...`), a JWT, a well-known API key
or token format, a PEM private key, and a URL with a password. A text that contains one is
hidden whole.

A hidden value is replaced by its kind and size (`[hidden: text, 19 characters]`, with the
shape that hid it, `[hidden card number: ...]`), never any of its content.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any

from .errors import InvalidInput

#: a word of a key that makes it secret on its own (compared lowercase, plural as singular)
SECRET_WORDS: frozenset[str] = frozenset(
    {
        # credentials
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "passcode",
        "secret",
        "token",
        "apikey",
        "privatekey",
        "credential",
        "authorization",
        "auth",
        "bearer",
        "cookie",
        "session",
        "jwt",
        "otp",
        "pin",
        "signature",
        # payment and identity numbers
        "pan",
        "cvc",
        "cvv",
        "csc",
        "iban",
        "ssn",
    }
)

#: two adjacent words of a key (the parent's last word first) that make it secret together;
#: `key` or `number` alone is not (an idempotency key, a case number)
SECRET_PAIRS: frozenset[tuple[str, str]] = frozenset(
    {
        ("api", "key"),
        ("private", "key"),
        ("access", "key"),
        ("signing", "key"),
        ("encryption", "key"),
        ("master", "key"),
        ("card", "number"),
        ("card", "num"),
        ("card", "no"),
        ("security", "code"),
        ("account", "number"),
        ("social", "security"),
    }
)

#: words that make a number under a secret-looking name a tally, shown as it is
COUNTING_WORDS: frozenset[str] = frozenset(
    {"count", "total", "max", "min", "limit", "used", "remaining", "length", "len", "size"}
)

#: the words of a name that may be tallied (`max_tokens`): a PIN or a CVC never is
_TALLIED: frozenset[str] = frozenset({"token", "session", "cookie", "credential", "signature"})

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def name_words(key: str) -> tuple[str, ...]:
    """The words of a key, lowercase: camelCase, snake_case, kebab-case and dots split."""
    return tuple(w.lower() for w in _WORD.findall(key))


_PAIR_WORDS = frozenset(w for pair in SECRET_PAIRS for w in pair)


def _singular(word: str) -> str:
    if word.endswith("s") and len(word) > 3 and word[:-1] in SECRET_WORDS | _PAIR_WORDS:
        return word[:-1]
    return word


def secret_name(key: str, value: Any = None, *, parent: str = "") -> bool:
    """Whether `key` (under `parent`, the key of the object or list that holds it) names a
    secret, given its `value` (a boolean, a null and a tally never are)."""
    if value is None or isinstance(value, bool):
        return False
    raw = name_words(key)
    words = tuple(_singular(w) for w in raw)
    single = [w for w in words if w in SECRET_WORDS]
    before = tuple(_singular(w) for w in name_words(parent)[-1:])
    chain = before + words
    paired = any(pair in SECRET_PAIRS for pair in pairwise(chain))
    if not single and not paired:
        return False
    if isinstance(value, int | float) and not paired and set(single) <= _TALLIED:
        plural = any(w != s for w, s in zip(raw, words, strict=True) if s in _TALLIED)
        if plural or COUNTING_WORDS & set(words):
            return False  # max_tokens, token_count: how many, not which
    return True


#: (what it is, a pattern found anywhere in a text) for every secret shape but card numbers
SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private key", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")),
    (
        "authorization",
        # a scheme and one credential (not a word in lowercase: "Basic information")
        re.compile(
            r"^\s*(?i:bearer|basic|digest|token|negotiate|bot)\s+"
            r"(?=[a-z]*[A-Z0-9._~+/=:-])[A-Za-z0-9._~+/=:-]{8,}\s*$"
            r"|\b(?i:bearer)\s+(?=[a-z]*[A-Z0-9._~+/=-])[A-Za-z0-9._~+/=-]{16,}"
        ),
    ),
    ("JWT", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*")),
    (
        "API key",
        re.compile(
            r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}"  # Stripe secret and restricted
            r"|\bwhsec_[A-Za-z0-9]{20,}"  # Stripe webhook signing secret
            r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"  # Slack
            r"|\bgh[pousr]_[A-Za-z0-9]{30,}|\bgithub_pat_[A-Za-z0-9_]{30,}"  # GitHub
            r"|\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"  # AWS access key id
            r"|\bAIza[A-Za-z0-9_-]{35}"  # Google
            r"|\bsk-[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic
            r"|\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"  # SendGrid
        ),
    ),
    ("URL with a password", re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]+:[^\s/@]+@")),
)

#: digits with at most one space or dash between two of them
_DIGIT_RUN = re.compile(r"[0-9]+(?:[ -][0-9]+)*")


def luhn(digits: str) -> bool:
    """The Luhn checksum every card number passes."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def _card_number(digits: str) -> bool:
    return 13 <= len(digits) <= 19 and digits[0] in "23456" and luhn(digits)


def _holds_card_number(text: str) -> bool:
    """Whether adjacent groups of one run of digits (`4242 4242 4242 4242`) form a card
    number. A group is never cut (no card number is looked for inside a longer number), and
    groups of one or two digits are not joined (`1 2 3 ...` is a list, not a card)."""
    for run in _DIGIT_RUN.finditer(text):
        groups = re.split(r"[ -]", run.group())
        for start in range(len(groups)):
            digits = ""
            for group in groups[start:]:
                if len(group) < 3:
                    break
                digits += group
                if len(digits) > 19:
                    break
                if _card_number(digits):
                    return True
    return False


def secret_shape(value: Any) -> str | None:
    """What secret `value` looks like ("card number", "JWT", ...), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return "card number" if _card_number(str(value)) else None
    if not isinstance(value, str):
        return None
    if _holds_card_number(value):
        return "card number"
    for kind, pattern in SHAPES:
        if pattern.search(value):
            return kind
    return None


#: a PEM private key from its first line to its last (or to the end of the text)
_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S
)


def scrub_text(text: str) -> str:
    """Free text (a review's reason, a provider's error quoted in it) with each part that
    looks like a secret replaced by its mask, the rest as written: a reason stays readable
    while the key, token or card number it quotes does not."""

    def masked(why: str) -> Callable[[re.Match[str]], str]:
        return lambda found: mask(found.group(), why)

    text = _PEM.sub(masked("private key"), text)
    for kind, pattern in SHAPES[1:]:
        text = pattern.sub(masked(kind), text)
    return _DIGIT_RUN.sub(
        lambda run: (
            mask(run.group(), "card number") if _holds_card_number(run.group()) else run.group()
        ),
        text,
    )


def mask(value: Any, why: str | None = None) -> str:
    """What is shown instead of a hidden value: its kind and size, and the shape that hid it."""
    label = f"hidden {why}" if why else "hidden"
    if isinstance(value, str):
        return f"[{label}: text, {_count(len(value), 'character')}]"
    if isinstance(value, Mapping):
        return f"[{label}: object, {_count(len(value), 'field')}]"
    if isinstance(value, list | tuple):
        return f"[{label}: list, {_count(len(value), 'item')}]"
    return f"[{label}: {type(value).__name__}]"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


Paths = Sequence[Sequence[str]]


def scrub(
    value: Any,
    paths: Paths = (),
    *,
    result_paths: Paths | None = None,
    hidden: list[str] | None = None,
    where: str = "",
    parent: str = "",
) -> Any:
    """`value` with every secret hidden (by name and by shape, at any depth), and the values
    at `paths` (dotted paths split into keys; one crossing a list applies to each item).
    Inside an object under a `result` key, `result_paths` apply instead of `paths` (a
    provider's result document, in a response or an evidence detail). The path of each
    hidden value is appended to `hidden`. `value` itself is never changed."""
    found: list[str] = [] if hidden is None else hidden
    if isinstance(value, list | tuple):
        return [
            scrub(
                item,
                paths,
                result_paths=result_paths,
                hidden=found,
                where=f"{where}[{i}]",
                parent=parent,
            )
            for i, item in enumerate(value)
        ]
    if not isinstance(value, Mapping):
        why = secret_shape(value)
        if why is None:
            return value
        found.append(where)
        return mask(value, why)
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = str(key)
        here = f"{where}.{name}" if where else name
        if [name] in [list(p) for p in paths] or secret_name(name, item, parent=parent):
            out[key] = mask(item)
            found.append(here)
            continue
        if name == "result" and result_paths is not None and isinstance(item, Mapping):
            deeper: Paths = result_paths
        else:
            deeper = [p[1:] for p in paths if len(p) > 1 and p[0] == name]
        out[key] = scrub(
            item, deeper, result_paths=result_paths, hidden=found, where=here, parent=name
        )
    return out


class RedactionRuleInvalid(InvalidInput):
    """A redaction rule is not ACTION=field[,field...]."""


def parse_rules(specs: Iterable[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(action, paths) of each `ACTION=path,path` rule (an action, or a prefix ending in
    '*'; dotted paths)."""
    rules = []
    for spec in specs:
        action, sep, paths = spec.partition("=")
        names = tuple(p.strip() for p in paths.split(",") if p.strip())
        if not sep or not action.strip() or not names:
            raise RedactionRuleInvalid(
                f"redaction rule {spec.strip()!r}: use ACTION=field[,field...], e.g. "
                "'crm.*=note,customer.email'",
                field="redact",
            )
        rules.append((action.strip(), names))
    return tuple(rules)


def rule_specs(text: str | None) -> list[str]:
    """The rules of a setting's value: `ACTION=path,path` rules separated by ';'."""
    return [s for s in (text or "").split(";") if s.strip()]
