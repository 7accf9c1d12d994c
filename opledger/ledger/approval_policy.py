"""Which acts a person must approve before anything is sent: an action's approval policy,
as data, and the pure decision it makes over an act's target and frozen payload.

An adapter declares a policy per action (`approval_policies`), a deployment overrides it
per action (`OPLEDGER_APPROVAL_POLICIES`); the ledger reads it through its action resolver
(`approval_policy(action)`) when it records a new act. A policy is one of:

- `"never"` (the default): nobody is asked;
- `"always"`: one person approves every act of the action;
- a tier, `{"when": [rule, ...], "approvers": 1 | 2, "expires_after_seconds": 86400}`:
  approval is required when ANY rule holds (`"when": "always"`: every act); `approvers`
  distinct people must approve (default 1); an approval not given within
  `expires_after_seconds` (default a day) expires and the operation is cancelled;
- a list of tiers: the tier holding with the most approvers decides (the highest tier).

A rule is one of:

- `{"field": "amount", "above": 10000}`: the payload's value at `field` (dotted for
  nested objects: `amount.value`) is a number above the threshold. A value that is
  present but not a number (a string that does not read as one, a boolean, an object)
  holds the rule: a value the policy cannot compare is asked about, never waved through.
  An absent value (or null) does not hold it;
- `{"field": "to", "count_above": 5}`: the value at `field` has more than that many items
  (a list's or an object's; a present scalar counts one, an absent value none);
- `{"target_matches": "ent-*"}`: the act's target matches the glob (`*`, `?`, `[...]`;
  case-sensitive), or any of a list of globs.

`requirement(policy, target, payload)` is the decision: pure, total, no I/O.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, NoReturn

from .errors import ApprovalPolicyInvalid, InvalidInput
from .ids import check_action

__all__ = [
    "ALWAYS",
    "DEFAULT_EXPIRY",
    "NEVER",
    "Policy",
    "Requirement",
    "Rule",
    "Tier",
    "parse_policies",
    "parse_policy",
    "policies_setting",
    "requirement",
]

#: how long an approval request waits for its people when the policy does not say
DEFAULT_EXPIRY = timedelta(days=1)
#: the longest a policy may let a request wait
MAX_EXPIRY = timedelta(days=30)
#: how many distinct people a tier may require
APPROVERS = (1, 2)
#: how many rules one tier may have, and tiers one policy
MAX_RULES = 50


@dataclass(frozen=True)
class Rule:
    """One condition over an act: `kind` is `above`, `count_above` or `target_matches`."""

    kind: str
    field: str | None = None
    threshold: Decimal | None = None
    patterns: tuple[str, ...] = ()

    def holds(self, target: str, payload: Mapping[str, Any]) -> str | None:
        """Why the rule holds for this act (one line), or None when it does not."""
        if self.kind == "target_matches":
            for pattern in self.patterns:
                if fnmatch.fnmatchcase(target, pattern):
                    return f"target {target!r} matches {pattern!r}"
            return None
        assert self.field is not None and self.threshold is not None
        found, value = _at(payload, self.field)
        if self.kind == "count_above":
            n = _count(value) if found else 0
            return f"{self.field} has {n} (above {self.threshold})" if n > self.threshold else None
        if not found or value is None:
            return None
        number = _number(value)
        if number is None:
            return f"{self.field} is not a number (a threshold of {self.threshold} applies)"
        return (
            f"{self.field} {number} is above {self.threshold}" if number > self.threshold else None
        )


@dataclass(frozen=True)
class Tier:
    """Approval by `approvers` people within `expires_after`, when any of `rules` holds
    (no rules: always)."""

    rules: tuple[Rule, ...]
    approvers: int = 1
    expires_after: timedelta = DEFAULT_EXPIRY
    always: bool = False

    def reasons(self, target: str, payload: Mapping[str, Any]) -> tuple[str, ...]:
        """Why this tier requires approval of the act (empty: it does not)."""
        if self.always:
            return ("every act of this action is approved",)
        return tuple(why for rule in self.rules if (why := rule.holds(target, payload)))


@dataclass(frozen=True)
class Policy:
    """An action's approval policy: its tiers (none: never)."""

    tiers: tuple[Tier, ...] = ()

    @property
    def reads_payload(self) -> bool:
        return any(r.field is not None for t in self.tiers for r in t.rules)


NEVER = Policy()
ALWAYS = Policy((Tier((), always=True),))


@dataclass(frozen=True)
class Requirement:
    """What an act needs before it is sent: `approvers` distinct people, within
    `expires_after`, and why (each holding rule, one line)."""

    approvers: int
    expires_after: timedelta
    reasons: tuple[str, ...]


def requirement(policy: Policy, target: str, payload: Mapping[str, Any]) -> Requirement | None:
    """The approval `policy` requires of the act on `target` with the frozen `payload`, or
    None when none is. Pure: the highest tier that holds decides (most approvers; the
    first such tier's expiry); its reasons are every holding tier's."""
    chosen: Tier | None = None
    reasons: list[str] = []
    for tier in policy.tiers:
        why = tier.reasons(target, payload)
        if not why:
            continue
        reasons.extend(w for w in why if w not in reasons)
        if chosen is None or tier.approvers > chosen.approvers:
            chosen = tier
    if chosen is None:
        return None
    return Requirement(
        approvers=chosen.approvers, expires_after=chosen.expires_after, reasons=tuple(reasons)
    )


# -- reading a policy ---------------------------------------------------------------------


def parse_policy(action: str, raw: Any) -> Policy:
    """`raw` (a declared or configured policy) as a `Policy`; `ApprovalPolicyInvalid`
    naming `action` and what is wrong otherwise. A `Policy` is returned as it is."""
    if isinstance(raw, Policy):
        return raw
    if raw is None or raw == "never":
        return NEVER
    if raw == "always":
        return ALWAYS
    if isinstance(raw, Mapping):
        return Policy((_tier(action, raw),))
    if isinstance(raw, Sequence) and not isinstance(raw, str | bytes):
        if not raw or len(raw) > MAX_RULES:
            _invalid(action, f"a list of tiers holds 1 to {MAX_RULES} tiers")
        return Policy(tuple(_tier(action, t) for t in raw))
    _invalid(action, f"{_shown(raw)} is not a policy")


def _tier(action: str, raw: Any) -> Tier:
    if not isinstance(raw, Mapping):
        _invalid(action, f"a tier is an object, not {_shown(raw)}")
    unknown = sorted(set(raw) - {"when", "approvers", "expires_after_seconds"})
    if unknown:
        _invalid(action, f"unknown key(s) {', '.join(map(repr, unknown))}")
    approvers = raw.get("approvers", 1)
    if isinstance(approvers, bool) or approvers not in APPROVERS:
        _invalid(action, f"approvers is 1 or 2 (distinct people), not {_shown(approvers)}")
    expires = raw.get("expires_after_seconds", DEFAULT_EXPIRY.total_seconds())
    if (
        isinstance(expires, bool)
        or not isinstance(expires, int | float)
        or not math.isfinite(expires)
        or not 0 < expires <= MAX_EXPIRY.total_seconds()
    ):
        _invalid(
            action,
            f"expires_after_seconds is a number of seconds above 0 and at most "
            f"{int(MAX_EXPIRY.total_seconds())}, not {_shown(expires)}",
        )
    when = raw.get("when")
    n, expiry = int(approvers), timedelta(seconds=expires)
    if when == "always":
        return Tier((), approvers=n, expires_after=expiry, always=True)
    if not isinstance(when, Sequence) or isinstance(when, str | bytes) or not when:
        _invalid(action, 'a tier needs "when": a list of rules (any one holding), or "always"')
    if len(when) > MAX_RULES:
        _invalid(action, f"a tier has at most {MAX_RULES} rules")
    return Tier(tuple(_rule(action, r) for r in when), approvers=n, expires_after=expiry)


def _rule(action: str, raw: Any) -> Rule:
    if not isinstance(raw, Mapping):
        _invalid(action, f"a rule is an object, not {_shown(raw)}")
    keys = set(raw)
    if keys == {"target_matches"}:
        given = raw["target_matches"]
        patterns = (given,) if isinstance(given, str) else given
        if (
            not isinstance(patterns, Sequence)
            or not patterns
            or not all(isinstance(p, str) and 0 < len(p) <= 200 for p in patterns)
        ):
            _invalid(action, "target_matches is a glob, or a list of globs (e.g. 'ent-*')")
        return Rule("target_matches", patterns=tuple(patterns))
    for kind in ("above", "count_above"):
        if keys == {"field", kind}:
            return Rule(kind, field=_field(action, raw["field"]), threshold=_limit(action, raw))
    _invalid(
        action,
        f"a rule is {{'field': ..., 'above': n}}, {{'field': ..., 'count_above': n}} or "
        f"{{'target_matches': glob}}, not {_shown(raw)}",
    )


def _field(action: str, field: Any) -> str:
    if (
        not isinstance(field, str)
        or not 0 < len(field) <= 200
        or any(not part for part in field.split("."))
    ):
        _invalid(action, f"a rule's field is a payload field name (dotted), not {_shown(field)}")
    return field


def _limit(action: str, raw: Mapping[str, Any]) -> Decimal:
    kind = "above" if "above" in raw else "count_above"
    value = raw[kind]
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (kind == "count_above" and (not isinstance(value, int) or value < 0)):
        what = "a whole number, 0 or more" if kind == "count_above" else "a finite number"
        _invalid(action, f"{kind} is {what}, not {_shown(value)}")
    return Decimal(str(value))


def _invalid(action: str, why: str) -> NoReturn:
    raise ApprovalPolicyInvalid(
        f"the approval policy of {action}: {why}", field="approval_policies", action=action
    )


def _shown(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


# -- a deployment's policies --------------------------------------------------------------


def parse_policies(
    document: Any, *, where: str = "OPLEDGER_APPROVAL_POLICIES"
) -> dict[str, Policy]:
    """A deployment's policies by action (a JSON object: `{"stripe.refund.v1": policy}`),
    each checked; `ApprovalPolicyInvalid` saying which is wrong otherwise."""
    if not isinstance(document, Mapping):
        raise ApprovalPolicyInvalid(
            f"{where} is a JSON object of policies by action, e.g. "
            '{"stripe.refund.v1": {"when": [{"field": "amount", "above": 10000}]}}',
            field="approval_policies",
        )
    policies: dict[str, Policy] = {}
    for action, raw in document.items():
        try:
            check_action(action)
        except InvalidInput as exc:
            raise ApprovalPolicyInvalid(
                f"{where}: {action!r} is not an action: {exc}", field="approval_policies"
            ) from None
        policies[action] = parse_policy(action, raw)
    return policies


def policies_setting(value: str) -> dict[str, Policy]:
    """`OPLEDGER_APPROVAL_POLICIES`' value read: inline JSON (it starts with `{`), or the
    path of a JSON file; `ApprovalPolicyInvalid` otherwise."""
    text = value.strip()
    if not text:
        return {}
    if not text.startswith("{"):
        try:
            text = Path(text).read_text(encoding="utf-8")
        except OSError as exc:
            raise ApprovalPolicyInvalid(
                f"OPLEDGER_APPROVAL_POLICIES: neither inline JSON nor a readable file: "
                f"{exc.strerror or exc}",
                field="approval_policies",
            ) from None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ApprovalPolicyInvalid(
            f"OPLEDGER_APPROVAL_POLICIES is not JSON: {exc}", field="approval_policies"
        ) from None
    return parse_policies(document)


def _at(payload: Mapping[str, Any], field: str) -> tuple[bool, Any]:
    """The value at a dotted `field` of the payload: (found, value)."""
    value: Any = payload
    for part in field.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _count(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, list | tuple | Mapping):
        return len(value)
    return 1


def _number(value: Any) -> Decimal | None:
    """A JSON number (or a string reading as a finite one) as a Decimal; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Decimal(str(value)) if math.isfinite(value) else None
    if isinstance(value, str) and 0 < len(value) <= 100:
        try:
            number = Decimal(value.strip())
        except InvalidOperation:
            return None
        return number if number.is_finite() else None
    return None
