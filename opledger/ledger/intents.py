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
field later keeps the intents already recorded. Pure: no I/O.

`Intent` is the one record of an asked act that travels from every surface (`Effects`, the
LangGraph tools, the MCP gateway, `Ledger.prepare` and `Ledger.ask`) to the ledger: built
once from a call's arguments, keyed (`Intent.keyed`) and recorded on one path.
"""

from __future__ import annotations

import hashlib
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
) -> str:
    """The intent key of `action` on `target` with `payload`: `<action>:<digest>`.

    The digest is over the canonical JSON (RFC 8785) of the action, the target (NFC), the
    intent fields' values and the normalised purpose, so the same act asked again — with
    other wording, under another tool-call id — has the same key, and another recipient,
    amount or purpose has another. Raises `InvalidInput` (or a payload error for a value
    that cannot be canonicalized)."""
    check_action(action)
    basis: dict[str, Any] = {
        "action": action,
        "target": check_key("target", target),
        "fields": intent_values(payload, fields),
    }
    chosen = normal_purpose(purpose)
    if chosen is not None:
        basis["purpose"] = chosen
    digest = hashlib.sha256(canonicalize(basis).text.encode()).hexdigest()
    return f"{action}:{digest[:DIGEST_CHARS]}"


def act_key(
    action: str,
    target: str,
    payload: Mapping[str, Any],
    *,
    declared: Callable[[str], Sequence[str]],
    fields: Sequence[str] | None = None,
    purpose: str | None = None,
) -> str:
    """`intent_key` over the action's intent fields: `fields` when given, else the ones
    `declared(action)` names (`Ledger.intent_fields`: what its adapter declares)."""
    chosen = declared(action) if fields is None else fields
    return intent_key(action, target, payload, fields=chosen, purpose=purpose)


@dataclass(frozen=True, kw_only=True)
class Intent:
    """One act of one workflow run, as a caller asks for it: what is recorded (the
    operation's tenant, workflow, intent, action, target, payload, grant and dependencies)
    and who asked. Every way of asking builds it once and hands it to the ledger.

    The intent is named by `intent_key` (the caller's own key), or else derived from the
    act (`keyed`): the action, the target, the values of the intent fields (`intent_fields`,
    else the action's declared ones) and `purpose`."""

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

    def keyed(self, declared: Callable[[str], Sequence[str]]) -> Intent:
        """This intent under its key: the caller's own, else derived from the act (its
        purpose and intent fields are in the key then). `declared(action)` gives the action's
        intent fields where `intent_fields` is None (`Ledger.intent_fields`)."""
        if self.intent_key is not None:
            if self.purpose is not None:
                raise InvalidInput(
                    "give either intent_key (your own) or purpose, not both", field="purpose"
                )
            return self
        key = act_key(
            self.action,
            self.target,
            self.payload,
            declared=declared,
            fields=self.intent_fields,
            purpose=self.purpose,
        )
        return replace(self, intent_key=key, purpose=None, intent_fields=None)


def payload_differences(recorded: Mapping[str, Any], asked: Mapping[str, Any]) -> tuple[str, ...]:
    """The top-level payload fields whose values differ between two payloads, sorted."""

    def text(payload: Mapping[str, Any], name: str) -> str | None:
        return canonicalize({"v": payload[name]}).text if name in payload else None

    names = set(recorded) | set(asked)
    return tuple(sorted(n for n in names if text(recorded, n) != text(asked, n)))


__all__ = [
    "MAX_PURPOSE_LENGTH",
    "Intent",
    "act_key",
    "check_fields",
    "field_value",
    "intent_key",
    "intent_values",
    "normal_purpose",
    "payload_differences",
]
