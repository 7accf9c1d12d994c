"""Canonical payloads: one text per value, whatever the key order; digests follow."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from opledger.ledger import canonicalize
from opledger.ledger.ids import check_operation_id, new_operation_id

json_scalars = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
objects = st.dictionaries(st.text(max_size=8), json_values, max_size=6)


@given(objects)
def test_key_order_does_not_change_the_canonical_form(payload: dict[str, Any]) -> None:
    reordered = dict(reversed(list(payload.items())))
    a, b = canonicalize(payload), canonicalize(reordered)
    assert a == b
    assert a.digest == hashlib.sha256(a.text.encode()).hexdigest()
    assert a.loads() == json.loads(json.dumps(payload))


@given(objects, objects)
def test_different_payloads_have_different_digests(a: dict[str, Any], b: dict[str, Any]) -> None:
    if json.loads(json.dumps(a)) != json.loads(json.dumps(b)):
        assert canonicalize(a).digest != canonicalize(b).digest


def test_new_ids_are_well_formed_unique_and_time_ordered() -> None:
    ids = [new_operation_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(check_operation_id(i) == i for i in ids)
    assert [i[:13] for i in ids] == sorted(i[:13] for i in ids)  # millisecond prefix
