"""Review-webhook signatures: the `Opledger-Signature` scheme of docs/webhooks.md.

Pure functions of the body, the secrets and a timestamp: the webhook adapter calls
`signature_header` once per send, and the settings use `secret_problem` to refuse a
secret before any process starts with it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence

#: the request header that carries the signature
HEADER = "Opledger-Signature"
#: the scheme's version tag: `v1` is HMAC-SHA256 over `<t>.<body>`, as lowercase hex
SCHEME = "v1"
#: how far from its own clock a receiver should accept a signature's timestamp (seconds)
TOLERANCE_SECONDS = 300
#: the shortest secret accepted: 32 characters, e.g. `openssl rand -hex 32` gives 64
MIN_SECRET_CHARS = 32

_PRINTABLE = re.compile(r"[\x21-\x7e]+")


def secret_problem(secret: str) -> str | None:
    """Why `secret` cannot sign webhooks (None: it can). Never quotes the secret."""
    if len(secret) < MIN_SECRET_CHARS:
        return (
            f"too short: {len(secret)} characters, at least {MIN_SECRET_CHARS} "
            "(e.g. `openssl rand -hex 32`)"
        )
    if _PRINTABLE.fullmatch(secret) is None:
        return (
            "it holds whitespace, a line break or a non-ASCII character (check how it was "
            "written into the environment)"
        )
    return None


def signature_header(body: bytes, secrets: Sequence[str], timestamp: int) -> str:
    """The `Opledger-Signature` value for `body` sent at `timestamp` (Unix seconds):
    `t=<timestamp>,v1=<hex>`, one `v1` per secret in the order given.

    Each `v1` is the HMAC-SHA256, keyed with the secret's ASCII bytes, of the timestamp's
    decimal digits, a `.`, and the body's exact bytes. Deterministic: the same body,
    secrets and timestamp give the same header."""
    if not secrets:
        raise ValueError("no secret to sign with")
    signed = f"{timestamp}.".encode() + body
    macs = [hmac.new(s.encode("ascii"), signed, hashlib.sha256).hexdigest() for s in secrets]
    return ",".join([f"t={timestamp}", *(f"{SCHEME}={mac}" for mac in macs)])
