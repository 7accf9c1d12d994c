"""Shared by the tests that spell an intent once and vary it: `Ledger.prepare`'s keyword
arguments as typed dicts, so the type checker holds each variant to the signature."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict


class Intent(TypedDict):
    """Everything `Ledger.prepare` must be told: `ledger.prepare(**intent)`."""

    tenant: str
    workflow_id: str
    intent_key: str
    action: str
    target: str
    payload: Mapping[str, Any]
    authorization_ref: str


class Change(TypedDict, total=False):
    """Some of an intent's fields, changed: `ledger.prepare(**(intent | change))`."""

    tenant: str
    workflow_id: str
    intent_key: str
    action: str
    target: str
    payload: Mapping[str, Any]
    authorization_ref: str
