"""What an operator is shown of a payload, a provider's response, evidence and a result.

Secrets are hidden for every action, wherever they are (`opledger.ledger.sensitive`: a key
by the words of its name, such as `cardNumber`, `client_secret` or `X-Api-Key`; a value by
its shape, such as a card number, a JWT or an `sk_live_` key). Rules hide more, per action:
a rule names an action, or a prefix ending in '*', and the fields it hides (dotted paths
into nested objects; a path crossing a list applies to each item); every matching rule
applies, to the payload and to the provider's result documents. A hidden value is shown as
its kind and size, never its content; the payload's digest stays on the page, so what was
sent can still be compared with a provider's record.

The console and the CLI (`ops show`, `review show`, `review audit`) show everything through
one `Redaction`: the bundled rules, `OPLEDGER_REDACT`'s, and `opledger console --redact`'s.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opledger.ledger import Attempt, Evidence
from opledger.ledger.sensitive import parse_rules, rule_specs, scrub

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
        """Rules from `ACTION=path,path` strings (as `opledger console --redact` takes);
        a malformed one is `RedactionRuleInvalid`."""
        bundled = DEFAULT_RULES if defaults else ()
        return cls(tuple(Rule(a, p) for a, p in (*bundled, *parse_rules(specs))))

    @classmethod
    def configured(cls, setting: str | None, specs: Iterable[str] = ()) -> Redaction:
        """The bundled rules, those of `OPLEDGER_REDACT`'s value (rules separated by ';'),
        then `specs`."""
        return cls.parse([*rule_specs(setting), *specs])

    def paths_for(self, action: str) -> tuple[str, ...]:
        return tuple(p for rule in self.rules if rule.matches(action) for p in rule.paths)

    def _split(self, action: str) -> list[list[str]]:
        return [p.split(".") for p in self.paths_for(action)]

    def apply(self, action: str, payload: Any) -> tuple[Any, list[str]]:
        """The payload with hidden values replaced, and the paths that were hidden."""
        hidden: list[str] = []
        return scrub(payload, self._split(action), hidden=hidden), hidden

    def document(self, action: str, value: Any) -> Any:
        """A recorded document of `action`'s operation (a provider's response, an evidence
        detail, the attempts and evidence a review was opened or resolved with) with its
        secrets hidden, and the action's rules applied to every result document in it."""
        return scrub(value, result_paths=self._split(action))

    def results(
        self, action: str, attempts: Sequence[Attempt], evidence: Sequence[Evidence]
    ) -> tuple[list[Attempt], list[Evidence]]:
        """Attempts and evidence as shown: their responses and details as `document` shows
        them (a confirmation's `result` hidden by the action's rules, like its payload)."""
        return (
            [
                a.model_copy(update={"response": self.document(action, a.response)})
                for a in attempts
            ],
            [e.model_copy(update={"detail": self.document(action, e.detail)}) for e in evidence],
        )
