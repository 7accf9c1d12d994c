"""Secrets in clear, by name and by shape, and what of them must never be printed:
shared by the redaction tests of the CLI, the console and the provider states."""

from __future__ import annotations

import json
from typing import Any

#: every key issue 30 saw in clear, each with a value that names where it was
SECRETS: dict[str, Any] = {
    "card": {"number": "card-number-in-clear", "exp": "12/30"},
    "cardNumber": "cardNumber-in-clear",
    "access_token": "access_token-in-clear",
    "client_secret": "client_secret-in-clear",
    "new_password": "new_password-in-clear",
    "headers": {"X-Api-Key": "x-api-key-in-clear", "Accept": "application/json"},
    "pan": "pan-in-clear",
}
#: and a value of each secret shape, under keys that say nothing
SHAPES: dict[str, str] = {
    "a": "4242 4242 4242 4242",
    "b": "Bearer abcDEF0123456789xyz",
    "c": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJlXzEy",
    "d": "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "e": "xoxb-123456789012-abcdefABCDEF",
    "f": "ghp_" + "A1b2" * 9,
    "g": "AKIAIOSFODNN7EXAMPLE",
}
CLEAR = [
    *(v for v in json.dumps(SECRETS).split('"') if v.endswith("-in-clear")),
    "4242 4242",
    "abcDEF0123",
    "eyJhbGci",
    "sk_live_",
    "xoxb-",
    "ghp_",
    "AKIAIOSF",
]
