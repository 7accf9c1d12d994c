"""Frozen payloads: RFC 8785 canonical JSON and its sha256 digest."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import rfc8785

from .errors import PayloadNotCanonicalizable, PayloadTooDeep, PayloadTooLarge

DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024
#: objects and arrays nested deeper than this are refused (the top object is depth 1)
MAX_DEPTH = 64
#: elements of one array, members of one object
MAX_ITEMS = 10_000
#: values in the whole payload (every object, array, string, number, ...)
MAX_NODES = 100_000


def payload_limit(raw: object) -> int:
    """A configured payload limit (`OPLEDGER_MAX_PAYLOAD_BYTES`): a positive whole number
    of bytes; unset or empty means the default. The one parser, for the ledger and the
    settings alike. Raises ValueError."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return DEFAULT_MAX_PAYLOAD_BYTES
    limit = 0
    if isinstance(raw, int) and not isinstance(raw, bool):
        limit = raw
    elif isinstance(raw, str) and raw.strip().isdigit():
        limit = int(raw)
    if limit <= 0:
        raise ValueError(f"must be a positive whole number of bytes, not {raw!r}")
    return limit


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


def check_shape(payload: Mapping[str, Any], *, max_bytes: int) -> None:
    """Refuse payloads too deep, too wide or with strings too long, before any recursion.

    Iterative (an explicit stack), so the answer never depends on the caller's stack
    depth, and cheap: it stops at the first value over a limit. Cycles are caught by the
    depth limit.
    """
    stack: list[tuple[Any, int]] = [(payload, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise PayloadTooLarge(
                f"payload holds more than {MAX_NODES} values", size=nodes, limit=MAX_NODES
            )
        if isinstance(value, str):
            if len(value) > max_bytes:
                raise PayloadTooLarge(
                    f"a string of {len(value)} characters cannot fit the {max_bytes}-byte limit",
                    size=len(value),
                    limit=max_bytes,
                )
            continue
        if isinstance(value, Mapping):
            children: Any = value.items()
        elif isinstance(value, list | tuple):
            children = value
        else:
            continue
        if depth > MAX_DEPTH:
            raise PayloadTooDeep(
                f"payload nests deeper than {MAX_DEPTH} levels", depth=depth, limit=MAX_DEPTH
            )
        if len(value) > MAX_ITEMS:
            raise PayloadTooLarge(
                f"an object or array of {len(value)} items; the limit is {MAX_ITEMS}",
                size=len(value),
                limit=MAX_ITEMS,
            )
        for child in children:
            if isinstance(value, Mapping):
                key, child = child
                if isinstance(key, str) and len(key) > max_bytes:
                    raise PayloadTooLarge(
                        f"a key of {len(key)} characters cannot fit the {max_bytes}-byte limit",
                        size=len(key),
                        limit=max_bytes,
                    )
            stack.append((child, depth + 1))


def _dumps(payload: dict[str, Any]) -> bytes:
    """rfc8785 recurses; with the depth bounded, a fresh thread's stack always suffices,
    so a caller deep in its own stack gets the same answer as any other."""
    try:
        return rfc8785.dumps(payload)
    except RecursionError:
        pass
    result: list[bytes] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(rfc8785.dumps(payload))
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name="opledger-canonicalize")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def canonicalize(
    payload: Mapping[str, Any], *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> CanonicalPayload:
    """Canonicalize a JSON object payload, or raise a typed error.

    Refused: anything but a mapping at the top, NaN and infinities, integers outside the
    range JSON numbers represent exactly, non-string keys, bytes and other non-JSON types,
    nesting deeper than `MAX_DEPTH`, objects or arrays of more than `MAX_ITEMS` items,
    more than `MAX_NODES` values, and canonical forms larger than `max_bytes`.
    """
    if not isinstance(payload, Mapping):
        raise PayloadNotCanonicalizable(
            f"payload must be a JSON object, not {type(payload).__name__}",
            reason="not_an_object",
        )
    check_shape(payload, max_bytes=max_bytes)
    try:
        raw = _dumps(dict(payload))
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
