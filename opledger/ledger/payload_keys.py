"""Frozen payloads encrypted at rest: the configured keys, sealing and opening.

`OPLEDGER_PAYLOAD_KEYS` lists keys as `key_id:base64(32 bytes)`, comma-separated. The
first one seals every payload written from now on; all of them open what they sealed, so
a new key goes first and the old ones stay until `opledger payloads rotate` has moved
every row to the new one.

A sealed payload is AES-256-GCM (`cryptography`'s AESGCM, authenticated): a random
12-byte nonce followed by the ciphertext and its tag, stored with the id of the key that
sealed it; the clear column stays empty. The associated data is the operation's id, so a
sealed payload copied onto another operation's row does not open. The payload's digest is
still taken over the canonical plaintext, before sealing: a replayed prepare, an intent
conflict and a provider's request digest compare digests, never ciphertexts.

Rows written before any key was configured (key id NULL) stay readable as they are.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import InvalidInput, LedgerError

#: the setting that holds the keys (read by every process that reads or writes payloads)
KEYS_VARIABLE = "OPLEDGER_PAYLOAD_KEYS"
#: AES-256
KEY_BYTES = 32
NONCE_BYTES = 12
#: a key id: short, printable, no separator of the setting's syntax
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: what the tag binds besides the ciphertext: this format, then the operation's id
_AAD = b"opledger.payload.v1:"
#: the same for a provider's result document (in an attempt's response, an evidence detail)
_RESULT_AAD = b"opledger.result.v1:"
#: the keys of a sealed result document, as it is stored in place of the document
SEALED_RESULT_KEYS = frozenset({"sealed", "key_id"})


class PayloadKeysInvalid(InvalidInput):
    """`OPLEDGER_PAYLOAD_KEYS` is malformed: expected `key_id:base64 of 32 bytes`, comma-
    separated, the key that encrypts first."""


class PayloadKeyUnknown(LedgerError):
    """A frozen payload was encrypted under a key id this process is not configured with."""


class PayloadUnreadable(LedgerError):
    """A frozen payload does not decrypt: the key under its id is not the one that
    encrypted it, or the encrypted payload was not written for this operation."""


class PayloadKeysMissing(LedgerError):
    """No payload key is configured, so nothing can be encrypted."""


@dataclass(frozen=True)
class PayloadKeys:
    """The configured keys, the first one sealing. Never shows its key material."""

    ids: tuple[str, ...]
    _ciphers: dict[str, AESGCM] = field(repr=False, compare=False)

    @property
    def current(self) -> str:
        """The id of the key every new payload is sealed with."""
        return self.ids[0]

    def seal(self, op_id: str, text: str) -> tuple[str, bytes]:
        """`text` (a canonical payload) sealed for operation `op_id` under the current key:
        its key id and nonce + ciphertext + tag."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[self.current].encrypt(nonce, text.encode(), _AAD + op_id.encode())
        return self.current, nonce + sealed

    def open(self, op_id: str, key_id: str, sealed: bytes) -> str:
        """The canonical text operation `op_id`'s row holds sealed under `key_id`, or
        `PayloadKeyUnknown` / `PayloadUnreadable`."""
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise PayloadKeyUnknown(
                f"the frozen payload of {op_id} is encrypted under key {key_id!r}, which "
                f"{KEYS_VARIABLE} does not list (configured: {', '.join(self.ids)})",
                op_id=op_id,
                key_id=key_id,
            )
        try:
            clear = cipher.decrypt(
                bytes(sealed[:NONCE_BYTES]), bytes(sealed[NONCE_BYTES:]), _AAD + op_id.encode()
            )
        except (InvalidTag, ValueError):
            raise PayloadUnreadable(
                f"the frozen payload of {op_id} does not decrypt under key {key_id!r}: another "
                "key under that id, or an encrypted payload not written for this operation",
                op_id=op_id,
                key_id=key_id,
            ) from None
        return clear.decode()


def seal_result(keys: PayloadKeys | None, op_id: str, doc: Any) -> Any:
    """A provider's result document as it is stored: sealed under the current key for
    operation `op_id` (`{"sealed": base64, "key_id": ...}`), or as it is without keys."""
    if keys is None or not isinstance(doc, Mapping):
        return doc
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    nonce = os.urandom(NONCE_BYTES)
    cipher = keys._ciphers[keys.current]
    sealed = nonce + cipher.encrypt(nonce, text.encode(), _RESULT_AAD + op_id.encode())
    return {"sealed": base64.b64encode(sealed).decode(), "key_id": keys.current}


def open_result(keys: PayloadKeys | None, op_id: str, doc: Any) -> Any:
    """A stored result document as it was given: opened when sealed. One that cannot be
    opened here (its key not configured, or not sealed for this operation) is replaced by
    a note saying why, so reading the history never fails for it."""
    if not (isinstance(doc, Mapping) and set(doc) == SEALED_RESULT_KEYS):
        return doc
    key_id = str(doc["key_id"])
    cipher = None if keys is None else keys._ciphers.get(key_id)
    if cipher is None:
        return {
            "unreadable": f"encrypted under key {key_id!r}, which {KEYS_VARIABLE} does not list"
        }
    try:
        raw = base64.b64decode(str(doc["sealed"]), validate=True)
        clear = cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _RESULT_AAD + op_id.encode())
    except (InvalidTag, ValueError, binascii.Error):
        return {"unreadable": f"does not decrypt under key {key_id!r} for this operation"}
    opened: Any = json.loads(clear)
    return opened


def parse_payload_keys(raw: str | None) -> PayloadKeys | None:
    """The keys `OPLEDGER_PAYLOAD_KEYS` lists (None when unset or empty), or
    `PayloadKeysInvalid`: one line naming the entry and its key id, never its key."""
    if raw is None or not raw.strip():
        return None
    ciphers: dict[str, AESGCM] = {}
    for n, entry in enumerate(raw.split(","), start=1):
        key_id, colon, encoded = entry.strip().partition(":")
        where = f"{KEYS_VARIABLE} entry {n}"
        if not colon:
            raise PayloadKeysInvalid(
                f"{where} has no 'key_id:' before its key (expected key_id:base64, "
                "comma-separated)",
                field=KEYS_VARIABLE,
            )
        if not _KEY_ID.fullmatch(key_id):
            raise PayloadKeysInvalid(
                f"{where}: a key id is 1 to 64 letters, digits, '.', '_' or '-', starting "
                "with a letter or digit",
                field=KEYS_VARIABLE,
            )
        if key_id in ciphers:
            raise PayloadKeysInvalid(
                f"{where}: key id {key_id!r} is listed twice", field=KEYS_VARIABLE
            )
        try:
            key = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != KEY_BYTES:
            raise PayloadKeysInvalid(
                f"{where} (key id {key_id!r}): the key must be {KEY_BYTES} random bytes in "
                "base64 (44 characters)",
                field=KEYS_VARIABLE,
            )
        ciphers[key_id] = AESGCM(key)
    return PayloadKeys(ids=tuple(ciphers), _ciphers=ciphers)


def payload_text(
    keys: PayloadKeys | None,
    op_id: str,
    canonical: str | None,
    key_id: str | None,
    sealed: bytes | None,
) -> str | None:
    """The canonical text of `op_id`'s payload row (its three columns): clear rows as they
    are, sealed ones opened; None when there is no row (purged)."""
    if key_id is None:
        return canonical
    if keys is None:
        raise PayloadKeyUnknown(
            f"the frozen payload of {op_id} is encrypted under key {key_id!r}, and "
            f"{KEYS_VARIABLE} is not set",
            op_id=op_id,
            key_id=key_id,
        )
    assert sealed is not None  # ck_operation_payloads_sealed_or_clear
    return keys.open(op_id, key_id, sealed)


def sealed_columns(keys: PayloadKeys | None, op_id: str, text: str) -> dict[str, object]:
    """The payload row's columns for `text`: sealed under the current key, or in clear
    when no key is configured."""
    if keys is None:
        return {"canonical": text, "key_id": None, "sealed": None}
    key_id, sealed = keys.seal(op_id, text)
    return {"canonical": None, "key_id": key_id, "sealed": sealed}
