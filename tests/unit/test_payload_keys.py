"""OPLEDGER_PAYLOAD_KEYS: parsed into keys that seal and open payloads bound to their
operation; a malformed value is one typed line that never shows key material."""

from __future__ import annotations

import base64

import pytest

from opledger.ledger.payload_keys import (
    PayloadKeysInvalid,
    PayloadKeyUnknown,
    PayloadUnreadable,
    parse_payload_keys,
)
from opledger.settings import Settings, SettingsInvalid

KEY = base64.b64encode(bytes(range(32))).decode()
OTHER = base64.b64encode(bytes(range(1, 33))).decode()
OP, OP2 = "op_01JAAAAAAAAAAAAAAAAAAAAAAA", "op_01JBBBBBBBBBBBBBBBBBBBBBBB"

MALFORMED = {
    "no key id": (KEY, "entry 1 has no 'key_id:'"),
    "an empty key id": (f":{KEY}", "entry 1: a key id is 1 to 64"),
    "a key id with a space": (f"k 1:{KEY}", "entry 1: a key id"),
    "a short key": (f"k1:{KEY[:-8]}=", "entry 1 (key id 'k1'): the key must be 32"),
    "not base64": (f"k1:{KEY[:-2]}!!", "entry 1 (key id 'k1'): the key must be 32"),
    "a 64-byte key": (f"k1:{base64.b64encode(bytes(64)).decode()}", "must be 32"),
    "the same id twice": (f"k1:{KEY},k1:{OTHER}", "entry 2: key id 'k1' is listed twice"),
    "an empty entry": (f"k1:{KEY},,k2:{OTHER}", "entry 2 has no 'key_id:'"),
    "a second entry malformed": (f"k1:{KEY},k2:{OTHER[:20]}", "entry 2 (key id 'k2')"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_value_is_one_typed_line_without_key_material(case: str) -> None:
    raw, said = MALFORMED[case]
    with pytest.raises(PayloadKeysInvalid) as refused:
        parse_payload_keys(raw)
    message = str(refused.value)
    assert said in message and message.startswith("OPLEDGER_PAYLOAD_KEYS entry")
    assert "\n" not in message
    for material in (KEY, OTHER, KEY[:12], OTHER[:12]):
        assert material not in message, message
    # the settings say the same, once, naming the variable and never the value
    with pytest.raises(SettingsInvalid) as invalid:
        Settings.from_environ({"OPLEDGER_PAYLOAD_KEYS": raw})
    line = str(invalid.value)
    assert line.startswith("OPLEDGER_PAYLOAD_KEYS: entry") and said in line, line
    assert "\n" not in line and KEY[:12] not in line and OTHER[:12] not in line


def test_unset_or_empty_means_no_keys() -> None:
    assert parse_payload_keys(None) is None
    assert parse_payload_keys("  ") is None
    assert Settings.from_environ({"OPLEDGER_PAYLOAD_KEYS": ""}).payload_keys is None


def test_the_first_key_seals_and_every_key_opens_what_it_sealed() -> None:
    old = parse_payload_keys(f"old:{OTHER}")
    both = parse_payload_keys(f" new:{KEY} , old:{OTHER} ")
    assert old is not None and both is not None
    assert both.ids == ("new", "old") and both.current == "new"
    key_id, sealed = old.seal(OP, '{"a":1}')
    assert key_id == "old" and b'"a"' not in sealed
    assert both.open(OP, key_id, sealed) == '{"a":1}'
    assert both.seal(OP, '{"a":1}')[0] == "new"
    assert old.seal(OP, "x")[1] != old.seal(OP, "x")[1]  # a fresh nonce each time
    assert KEY not in repr(both) and OTHER not in repr(both)


def test_a_sealed_payload_opens_only_for_its_operation_untouched_and_under_its_key() -> None:
    keys = parse_payload_keys(f"k1:{KEY}")
    impostor = parse_payload_keys(f"k1:{OTHER}")
    assert keys is not None and impostor is not None
    _, sealed = keys.seal(OP, '{"a":1}')
    with pytest.raises(PayloadUnreadable, match=OP2):
        keys.open(OP2, "k1", sealed)
    flipped = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(PayloadUnreadable):
        keys.open(OP, "k1", flipped)
    with pytest.raises(PayloadUnreadable):
        impostor.open(OP, "k1", sealed)
    with pytest.raises(PayloadKeyUnknown, match=r"key 'k0'.*configured: k1") as unknown:
        keys.open(OP, "k0", sealed)
    assert unknown.value.fields["key_id"] == "k0" and KEY not in str(unknown.value)
