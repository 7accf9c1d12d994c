"""Which parts of a frozen payload the console hides, per action.

A rule names an action, or a prefix ending in '*', and the payload fields it hides (dotted
paths into nested objects; a path crossing a list applies to each item). Every matching
rule applies. Some field names are hidden for every action wherever they appear (secrets).
A hidden value is shown as its kind and size, never its content; the payload's digest stays
on the page, so what was sent can still be compared with a provider's record.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opledger.ledger import Attempt, Evidence
from opledger.ledger.errors import InvalidInput

#: hidden for every action, wherever they appear (compared case-insensitively)
ALWAYS: frozenset[str] = frozenset(
    {
        "password",
        "secret",
        "token",
        "api_key",
        "apikey",
        "authorization",
        "card_number",
        "cvc",
        "cvv",
        "iban",
        "ssn",
    }
)

#: the bundled rules: an email's content is the recipient's business, not the operator's
DEFAULT_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("email.*", ("text", "html", "body", "attachments")),
)


@dataclass(frozen=True)
class Rule:
    action: str  #: an action, or a prefix ending in '*'
    paths: tuple[str, ...]

    def matches(self, action: str) -> bool:
        return fnmatch.fnmatchcase(action, self.action)


@dataclass(frozen=True)
class Redaction:
    rules: tuple[Rule, ...] = field(
        default_factory=lambda: tuple(Rule(a, p) for a, p in DEFAULT_RULES)
    )

    @classmethod
    def parse(cls, specs: Iterable[str], *, defaults: bool = True) -> Redaction:
        """Rules from `ACTION=path,path` strings (as `opledger console --redact` takes)."""
        rules = [Rule(a, p) for a, p in DEFAULT_RULES] if defaults else []
        for spec in specs:
            action, sep, paths = spec.partition("=")
            names = tuple(p.strip() for p in paths.split(",") if p.strip())
            if not sep or not action.strip() or not names:
                raise InvalidInput(
                    f"redaction rule {spec!r}: use ACTION=field[,field...], e.g. "
                    "'crm.*=note,customer.email'",
                    field="redact",
                )
            rules.append(Rule(action.strip(), names))
        return cls(tuple(rules))

    def paths_for(self, action: str) -> tuple[str, ...]:
        return tuple(p for rule in self.rules if rule.matches(action) for p in rule.paths)

    def apply(self, action: str, payload: Any) -> tuple[Any, list[str]]:
        """The payload with hidden values replaced, and the paths that were hidden."""
        hidden: list[str] = []
        paths = [p.split(".") for p in self.paths_for(action)]
        return _redact(payload, paths, "", hidden), hidden

    def results(
        self, action: str, attempts: Sequence[Attempt], evidence: Sequence[Evidence]
    ) -> tuple[list[Attempt], list[Evidence]]:
        """Attempts and evidence as shown: every provider result document they carry (a
        confirmation's `result`, wherever a response or a detail holds one) hidden by the
        action's rules, like its payload."""

        def shown(value: Any) -> Any:
            if isinstance(value, list):
                return [shown(item) for item in value]
            if not isinstance(value, Mapping):
                return value
            return {
                k: self.apply(action, v)[0]
                if k == "result" and isinstance(v, Mapping)
                else shown(v)
                for k, v in value.items()
            }

        return (
            [a.model_copy(update={"response": shown(a.response)}) for a in attempts],
            [e.model_copy(update={"detail": shown(e.detail)}) for e in evidence],
        )


def _mask(value: Any) -> str:
    if isinstance(value, str):
        return f"[hidden: text, {len(value)} characters]"
    if isinstance(value, Mapping):
        return f"[hidden: object, {len(value)} fields]"
    if isinstance(value, list):
        return f"[hidden: list, {len(value)} items]"
    return f"[hidden: {type(value).__name__}]"


def _redact(value: Any, paths: list[list[str]], where: str, hidden: list[str]) -> Any:
    if isinstance(value, list):
        return [_redact(item, paths, f"{where}[{i}]", hidden) for i, item in enumerate(value)]
    if not isinstance(value, Mapping):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        here = f"{where}.{key}" if where else str(key)
        if str(key).lower() in ALWAYS or [str(key)] in paths:
            out[key] = _mask(item)
            hidden.append(here)
            continue
        deeper = [p[1:] for p in paths if len(p) > 1 and p[0] == key]
        out[key] = _redact(item, deeper, here, hidden)
    return out
