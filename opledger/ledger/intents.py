"""The intent of an effect an agent asks for: what makes it a different business act.

A model asked again (after a crash, a time-travel replay, a fork) invents new tool-call
ids and may reword its arguments; an MCP client re-issues a lost call under a new request
id. None of those ids is an intent. The intent of an agent's effect is its run (the
workflow id: a LangGraph thread, a workflow run) plus what this module derives from the
act itself:

- the versioned action and the target (close *case-318*, email *owner@acme.test*);
- the action's declared *intent fields*: payload fields whose value makes it another act
  (the fields an update sets, an amount, a template). Every other payload field is
  wording: a re-ask that changes only those is the same act, answered with the recorded
  operation and never sent;
- an explicit `purpose`, only when the caller deliberately asks for the same act again
  (a second reminder): two intentionally identical acts differ in their purpose.

By default an action's intent fields are none: its intent is the action and the target.
A field that is absent (or null) counts as not given, so declaring a new optional intent
field later keeps the intents already recorded.

How wide an act is, is its action's *intent scope* (declared beside the intent fields):
`run` (the default) is one act per run — the same act asked in another run is another
act; `tenant` is one act whatever run or agent of the tenant asks (refunding charge ch_1
of 500, closing case-318), so the run is no part of it. A tenant-wide act's key has a form
of its own (`<action>:tenant:<digest>`, the scope in the digest too), which a run's key may
never take: the two never name one operation. A key the caller names itself
(`intent_key=`) names an act of its run. Pure: no I/O.

`Intent` is the one record of an asked act that travels from every surface (`Effects`, the
LangGraph tools, the MCP gateway, `Ledger.prepare` and `Ledger.ask`) to the ledger: built
once from a call's arguments, keyed (`Intent.keyed`) and recorded on one path.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .canonical import canonicalize
from .errors import InvalidInput
from .ids import check_action, check_key

#: how long a purpose may be (it names the act in words: "second reminder")
MAX_PURPOSE_LENGTH = 120
#: hex digits of the sha256 kept in the key: 128 bits
DIGEST_CHARS = 32

#: one act per run (the default): the same act asked in another run is another act
RUN = "run"
#: one act per tenant: the same act whatever run or agent of the tenant asks
TENANT = "tenant"
SCOPES = (RUN, TENANT)
#: the form of a tenant-wide act's key, and only of it
_TENANT_KEY = re.compile(rf"[a-z0-9_.]+:{TENANT}:[0-9a-f]{{{DIGEST_CHARS}}}")


def check_scope(scope: object, *, field: str = "intent_scope") -> str:
    """An intent scope: `run` or `tenant`."""
    if scope not in SCOPES:
        raise InvalidInput(
            f"{scope!r} is not an intent scope (one of: {', '.join(SCOPES)})", field=field
        )
    assert isinstance(scope, str)
    return scope


def tenant_wide(key: str) -> bool:
    """Whether `key` has the form of a tenant-wide act's key (`intent_key` under `tenant`)."""
    return _TENANT_KEY.fullmatch(key) is not None


def parse_scopes(text: str) -> dict[str, str]:
    """A deployment's intent scopes (`OPLEDGER_INTENT_SCOPES`): `action=scope` pairs
    separated by commas, e.g. `stripe.refund.v1=tenant,crm.close_case.v1=run`. Raises
    `InvalidInput` saying which pair is wrong."""
    scopes: dict[str, str] = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        action, equals, scope = (part.strip() for part in pair.partition("="))
        if not equals or not action:
            raise InvalidInput(
                f"{pair!r} is not action=scope (e.g. stripe.refund.v1=tenant)",
                field="intent_scopes",
            )
        try:
            check_action(action)
        except InvalidInput as exc:
            raise InvalidInput(f"{pair!r}: {exc}", field="intent_scopes") from None
        if action in scopes:
            raise InvalidInput(f"{action} is given twice", field="intent_scopes")
        scopes[action] = check_scope(scope, field="intent_scopes")
    return scopes


def check_fields(fields: Sequence[str]) -> tuple[str, ...]:
    """Intent fields: payload field names, dotted for nested ones (`amount.value`)."""
    if isinstance(fields, str):
        raise InvalidInput(
            "intent_fields must be a list of field names, not one string", field="intent_fields"
        )
    checked = []
    for name in fields:
        if not isinstance(name, str) or not name or any(not part for part in name.split(".")):
            raise InvalidInput(
                f"intent field {name!r} is not a field name (dotted for nested fields)",
                field="intent_fields",
            )
        checked.append(name)
    return tuple(sorted(set(checked)))


def normal_purpose(purpose: str | None) -> str | None:
    """A purpose as it is compared: NFC, case-folded, runs of whitespace as one space.

    "Second reminder" and "second  reminder" name one act; an empty purpose is none."""
    if purpose is None:
        return None
    if not isinstance(purpose, str):
        raise InvalidInput("purpose must be text", field="purpose")
    text = " ".join(unicodedata.normalize("NFC", purpose).casefold().split())
    if not text:
        return None
    return check_key("purpose", text, max_length=MAX_PURPOSE_LENGTH)


def field_value(payload: Mapping[str, Any], name: str) -> Any:
    """The value of a (dotted) field in `payload`, or None when it is absent."""
    value: Any = payload
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def intent_values(payload: Mapping[str, Any], fields: Sequence[str]) -> dict[str, Any]:
    """The declared intent fields `payload` gives (absent and null ones left out)."""
    values = {name: field_value(payload, name) for name in check_fields(fields)}
    return {name: value for name, value in values.items() if value is not None}


def intent_key(
    action: str,
    target: str,
    payload: Mapping[str, Any],
    *,
    fields: Sequence[str] = (),
    purpose: str | None = None,
    scope: str = RUN,
) -> str:
    """The intent key of `action` on `target` with `payload`: `<action>:<digest>`, and
    `<action>:tenant:<digest>` for an act of the tenant's scope.

    The digest is over the canonical JSON (RFC 8785) of the action, the target (NFC), the
    intent fields' values, the normalised purpose and a scope wider than the run, so the
    same act asked again — with other wording, under another tool-call id — has the same
    key, and another recipient, amount, purpose or scope has another. Raises
    `InvalidInput` (or a payload error for a value that cannot be canonicalized)."""
    check_action(action)
    basis: dict[str, Any] = {
        "action": action,
        "target": check_key("target", target),
        "fields": intent_values(payload, fields),
    }
    chosen = normal_purpose(purpose)
    if chosen is not None:
        basis["purpose"] = chosen
    if check_scope(scope) != RUN:  # a run's keys stay what they were before scopes
        basis["scope"] = scope
    digest = hashlib.sha256(canonicalize(basis).text.encode()).hexdigest()[:DIGEST_CHARS]
    return f"{action}:{digest}" if scope == RUN else f"{action}:{scope}:{digest}"


def act_key(
    action: str,
    target: str,
    payload: Mapping[str, Any],
    *,
    declared: Callable[[str], Sequence[str]],
    fields: Sequence[str] | None = None,
    purpose: str | None = None,
    scoped: Callable[[str], str] | None = None,
) -> str:
    """`intent_key` over the action's intent fields — `fields` when given, else the ones
    `declared(action)` names (`Ledger.intent_fields`: what its adapter declares) — in the
    scope `scoped(action)` gives (`Ledger.intent_scope`; None: the run's)."""
    chosen = declared(action) if fields is None else fields
    scope = RUN if scoped is None else scoped(action)
    return intent_key(action, target, payload, fields=chosen, purpose=purpose, scope=scope)


@dataclass(frozen=True, kw_only=True)
class Intent:
    """One act of one workflow run, as a caller asks for it: what is recorded (the
    operation's tenant, workflow, intent, action, target, payload, grant and dependencies)
    and who asked. Every way of asking builds it once and hands it to the ledger.

    The intent is named by `intent_key` (the caller's own key: an act of its run), or else
    derived from the act (`keyed`): the action, the target, the values of the intent fields
    (`intent_fields`, else the action's declared ones), `purpose`, and the action's
    declared scope (`scope` says which, once keyed)."""

    tenant: str
    #: the workflow run (a LangGraph thread, an MCP caller's run, a workflow of yours)
    workflow_id: str
    action: str
    target: str
    payload: Mapping[str, Any]
    authorization_ref: str
    #: the intent named by the caller; None: derived from the act (`keyed`)
    intent_key: str | None = None
    #: only to ask deliberately for the same act again ("second reminder")
    purpose: str | None = None
    #: the payload fields that make another act (None: the action's declared ones)
    intent_fields: Sequence[str] | None = None
    #: the asker's own id for this call (a tool-call id, a request id): evidence only
    asked_by: str | None = None
    #: the operations (ids) it runs after: it is claimed once each of them is confirmed
    after: Sequence[str] = ()
    #: how wide the act is (`run` or `tenant`), as `keyed` derived it from the action's
    #: declaration; None: the run's (a key of the caller's own names an act of its run)
    scope: str | None = None

    def keyed(
        self,
        declared: Callable[[str], Sequence[str]],
        scoped: Callable[[str], str] | None = None,
    ) -> Intent:
        """This intent under its key: the caller's own, else derived from the act (its
        purpose and intent fields are in the key then) in the action's scope.
        `declared(action)` gives the action's intent fields where `intent_fields` is None
        (`Ledger.intent_fields`), `scoped(action)` its scope (`Ledger.intent_scope`; None:
        the run's). A scope given on an intent still to be keyed must be the action's: one
        act asked from two places must get one key, so the scope is the action's
        declaration (its adapter's, or the deployment's `OPLEDGER_INTENT_SCOPES`), not a
        caller's choice. A key of your own (`intent_key=`) names an act of your run."""
        if self.intent_key is not None:
            if self.purpose is not None:
                raise InvalidInput(
                    "give either intent_key (your own) or purpose, not both", field="purpose"
                )
            return self
        scope = RUN if scoped is None else check_scope(scoped(self.action))
        if self.scope is not None and check_scope(self.scope, field="scope") != scope:
            raise InvalidInput(
                f"{self.action} is an act of the {scope}'s scope, not the {self.scope}'s: the "
                "scope is the action's declaration (its adapter's intent_scopes, or "
                "OPLEDGER_INTENT_SCOPES), the same for every asker; to do it again on "
                "purpose give a purpose, to name an act of your run give intent_key",
                field="scope",
            )
        key = act_key(
            self.action,
            self.target,
            self.payload,
            declared=declared,
            fields=self.intent_fields,
            purpose=self.purpose,
            scoped=lambda _action: scope,
        )
        return replace(self, intent_key=key, purpose=None, intent_fields=None, scope=scope)


def payload_differences(recorded: Mapping[str, Any], asked: Mapping[str, Any]) -> tuple[str, ...]:
    """The top-level payload fields whose values differ between two payloads, sorted."""

    def text(payload: Mapping[str, Any], name: str) -> str | None:
        return canonicalize({"v": payload[name]}).text if name in payload else None

    names = set(recorded) | set(asked)
    return tuple(sorted(n for n in names if text(recorded, n) != text(asked, n)))


__all__ = [
    "MAX_PURPOSE_LENGTH",
    "RUN",
    "SCOPES",
    "TENANT",
    "Intent",
    "act_key",
    "check_fields",
    "check_scope",
    "field_value",
    "intent_key",
    "intent_values",
    "normal_purpose",
    "parse_scopes",
    "payload_differences",
    "tenant_wide",
]
