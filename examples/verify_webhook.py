"""Verify an opledger review webhook's Opledger-Signature (docs/webhooks.md).

Standard library only. Pass the request body exactly as received (bytes, before any JSON
parsing), the header's value and the secrets you accept (the current one, and the
previous one while rotating). Answer 2xx only after `verify` returns, and deduplicate by
the Idempotency-Key header.
"""

import hashlib
import hmac
import time

TOLERANCE_SECONDS = 300  # 5 minutes, either way


class BadSignature(Exception):
    """Not a fresh request signed with a secret this receiver accepts."""


def verify(body: bytes, header: str, secrets: list[str], now: float | None = None) -> int:
    """The request's signed Unix time, or BadSignature."""
    stamps, macs = [], []
    for item in header.split(","):
        key, _, value = item.partition("=")
        if key == "t":
            stamps.append(value)
        elif key == "v1":
            macs.append(value)
    if len(stamps) != 1 or not (stamps[0].isascii() and stamps[0].isdigit()) or not macs:
        raise BadSignature("malformed Opledger-Signature header")
    t = stamps[0]
    if abs((time.time() if now is None else now) - int(t)) > TOLERANCE_SECONDS:
        raise BadSignature("timestamp outside the tolerance: stale, replayed or a bad clock")
    signed = t.encode() + b"." + body
    for secret in secrets:
        expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest().encode()
        if any(hmac.compare_digest(expected, mac.encode()) for mac in macs):
            return int(t)
    raise BadSignature("no signature made with a secret this receiver accepts")
