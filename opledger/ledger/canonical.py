"""Frozen payloads: RFC 8785 canonical JSON and its sha256 digest."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import rfc8785

from .errors import PayloadNotCanonicalizable, PayloadTooLarge

DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class CanonicalPayload:
    """The canonical text of a payload, its size in bytes and its sha256 digest (hex)."""

    text: str
    size: int
    digest: str

    def loads(self) -> dict[str, Any]:
        value = json.loads(self.text)
        assert isinstance(value, dict)
        return value


def canonicalize(
    payload: Mapping[str, Any], *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> CanonicalPayload:
    """Canonicalize a JSON object payload, or raise a typed error.

    Refused: anything but a mapping at the top, NaN and infinities, integers outside the
    range JSON numbers represent exactly, non-string keys, bytes and other non-JSON types,
    and canonical forms larger than `max_bytes`.
    """
    if not isinstance(payload, Mapping):
        raise PayloadNotCanonicalizable(
            f"payload must be a JSON object, not {type(payload).__name__}",
            reason="not_an_object",
        )
    try:
        raw = rfc8785.dumps(dict(payload))
    except rfc8785.CanonicalizationError as exc:
        raise PayloadNotCanonicalizable(
            f"payload cannot be canonicalized: {exc}", reason=str(exc)
        ) from exc
    except (TypeError, ValueError, RecursionError) as exc:
        raise PayloadNotCanonicalizable(
            f"payload cannot be canonicalized: {exc}", reason=str(exc)
        ) from exc
    if len(raw) > max_bytes:
        raise PayloadTooLarge(
            f"canonical payload is {len(raw)} bytes; the limit is {max_bytes}",
            size=len(raw),
            limit=max_bytes,
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:  # lone surrogates in input strings
        raise PayloadNotCanonicalizable(
            "payload holds text that is not valid Unicode", reason="invalid_unicode"
        ) from exc
    return CanonicalPayload(text=text, size=len(raw), digest=hashlib.sha256(raw).hexdigest())
