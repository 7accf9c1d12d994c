"""The limits and refusals of `canonicalize`, at their exact edges (what `make mutate` asks).

`canonicalize` promises: a JSON object in, its RFC 8785 text, byte size and sha256 out;
anything else refused with a typed error carrying structured fields. Objects and arrays
nest at most `MAX_DEPTH` deep (the top object is depth 1), hold at most `MAX_ITEMS` items,
the payload at most `MAX_NODES` values, and the canonical form at most `max_bytes` bytes:
a limit is a maximum that is itself allowed. The answer never depends on where in the
payload the offending value sits, nor on how deep in its own stack the caller is.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from opledger.ledger import canonicalize
from opledger.ledger.canonical import MAX_DEPTH, MAX_ITEMS, MAX_NODES
from opledger.ledger.errors import PayloadNotCanonicalizable, PayloadTooDeep, PayloadTooLarge

T = TypeVar("T")
BIG = 10**8  # a byte limit no payload here comes near, where another limit is under test


def nested(depth: int, innermost: Any = None) -> dict[str, Any]:
    """`depth` objects inside each other (the top one included), built without recursion."""
    inner: dict[str, Any] = {} if innermost is None else {"v": innermost}
    for _ in range(depth - 1):
        inner = {"x": inner}
    return inner


def nested_arrays(depth: int) -> dict[str, Any]:
    """An object holding arrays inside arrays: `depth` containers in all."""
    inner: list[Any] = []
    for _ in range(depth - 2):
        inner = [inner]
    return {"x": inner}


def with_values(n: int) -> dict[str, Any]:
    """An object holding exactly `n` values in all, itself included, no array too wide."""
    payload: dict[str, Any] = {}
    left = n - 1
    while left:
        take = min(left, MAX_ITEMS)  # one array and its elements
        payload[f"k{len(payload)}"] = [0] * (take - 1)
        left -= take
    return payload


def _stack_depth() -> int:
    depth = 0
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    return depth


def near_the_recursion_limit(call: Callable[[], T], frames_left: int = 60) -> T:
    """Run `call` with only about `frames_left` frames of stack left."""

    def down(n: int) -> T:
        return down(n - 1) if n > 0 else call()

    return down(sys.getrecursionlimit() - _stack_depth() - frames_left)


def refusal(call: Callable[[], object]) -> Exception:
    with pytest.raises(Exception) as info:
        call()
    return info.value


# -- what a canonical payload is ------------------------------------------------------------


def test_the_size_is_the_canonical_text_in_utf8_bytes_and_the_digest_is_its_sha256() -> None:
    frozen = canonicalize({"b": "é€", "a": [1, 2.5, None, True]})
    assert frozen.text == '{"a":[1,2.5,null,true],"b":"é€"}'
    raw = frozen.text.encode("utf-8")
    assert frozen.size == len(raw) == len(frozen.text) + 1 + 2  # é is 2 bytes, € is 3
    assert frozen.digest == hashlib.sha256(raw).hexdigest()


# -- limits are maxima that are themselves allowed -------------------------------------------


def test_a_canonical_form_of_exactly_max_bytes_is_accepted_and_one_byte_more_refused() -> None:
    frame = len('{"x":""}')
    exact = canonicalize({"x": "y" * (100 - frame)}, max_bytes=100)
    assert exact.size == 100
    with pytest.raises(PayloadTooLarge) as info:
        canonicalize({"x": "y" * (101 - frame)}, max_bytes=100)
    assert (info.value.fields["size"], info.value.fields["limit"]) == (101, 100)


def test_nesting_exactly_max_depth_is_accepted_and_one_level_more_refused() -> None:
    assert canonicalize(nested(MAX_DEPTH, innermost="leaf"), max_bytes=BIG)
    assert canonicalize(nested_arrays(MAX_DEPTH), max_bytes=BIG)
    for too_deep in (nested(MAX_DEPTH + 1), nested_arrays(MAX_DEPTH + 1)):
        with pytest.raises(PayloadTooDeep) as info:
            canonicalize(too_deep, max_bytes=BIG)
        assert (info.value.fields["depth"], info.value.fields["limit"]) == (
            MAX_DEPTH + 1,
            MAX_DEPTH,
        )
        assert str(MAX_DEPTH) in str(info.value)


def test_exactly_max_items_in_one_array_or_object_is_accepted_and_one_more_refused() -> None:
    assert canonicalize({"x": [0] * MAX_ITEMS}, max_bytes=BIG)
    assert canonicalize({f"k{i}": 0 for i in range(MAX_ITEMS)}, max_bytes=BIG)
    for too_wide in ({"x": [0] * (MAX_ITEMS + 1)}, {f"k{i}": 0 for i in range(MAX_ITEMS + 1)}):
        with pytest.raises(PayloadTooLarge) as info:
            canonicalize(too_wide, max_bytes=BIG)
        assert (info.value.fields["size"], info.value.fields["limit"]) == (MAX_ITEMS + 1, MAX_ITEMS)


def test_exactly_max_nodes_values_are_accepted_and_one_more_refused() -> None:
    assert canonicalize(with_values(MAX_NODES), max_bytes=BIG)
    with pytest.raises(PayloadTooLarge) as info:
        canonicalize(with_values(MAX_NODES + 1), max_bytes=BIG)
    assert (info.value.fields["size"], info.value.fields["limit"]) == (MAX_NODES + 1, MAX_NODES)


# -- every refusal says what it refused, with its fields ------------------------------------


TOO_LARGE = [
    ("canonical form", {"a": "y" * 40, "b": "y" * 40}, 64, 64),
    ("string of exactly max_bytes", {"x": "y" * 64}, 64, 64),
    ("string over max_bytes", {"x": "y" * 65}, 64, 64),
    ("key of exactly max_bytes", {"y" * 64: 1}, 64, 64),
    ("key over max_bytes", {"y" * 65: 1}, 64, 64),
    ("deep string over max_bytes", nested(10, innermost=["y" * 65]), 64, 64),
    ("wide array", {"x": [0] * (MAX_ITEMS + 1)}, BIG, MAX_ITEMS),
    ("wide object", {f"k{i}": 0 for i in range(MAX_ITEMS + 1)}, BIG, MAX_ITEMS),
    ("too many values", with_values(MAX_NODES + 1), BIG, MAX_NODES),
]


@pytest.mark.parametrize(
    ("payload", "max_bytes", "limit"),
    [case[1:] for case in TOO_LARGE],
    ids=[case[0] for case in TOO_LARGE],
)
def test_a_too_large_refusal_names_a_size_over_the_limit_it_broke(
    payload: dict[str, Any], max_bytes: int, limit: int
) -> None:
    exc = refusal(lambda: canonicalize(payload, max_bytes=max_bytes))
    assert isinstance(exc, PayloadTooLarge)
    assert exc.fields["limit"] == limit
    assert isinstance(exc.fields["size"], int) and exc.fields["size"] > exc.fields["limit"]
    assert str(limit) in str(exc)


@pytest.mark.parametrize("payload", [["a", "list"], "text", 42, None], ids=repr)
def test_anything_but_an_object_at_the_top_is_refused_and_named(payload: Any) -> None:
    exc = refusal(lambda: canonicalize(payload))
    assert isinstance(exc, PayloadNotCanonicalizable)
    assert exc.fields["reason"] == "not_an_object"
    assert type(payload).__name__ in str(exc)


NOT_JSON = [
    ("nan", {"x": math.nan}),
    ("infinity", {"x": -math.inf}),
    ("huge int", {"x": 2**60}),
    ("non-string key", {1: "x"}),
    ("bytes", {"x": b"raw"}),
    ("set", {"x": {1, 2}}),
    ("lone surrogate", {"x": "\ud800"}),
    ("lone surrogate in a key", {"a": 1, "\udfff": 2}),
]


@pytest.mark.parametrize("payload", [case[1] for case in NOT_JSON], ids=[c[0] for c in NOT_JSON])
def test_a_value_json_cannot_hold_is_refused_with_its_cause(payload: dict[Any, Any]) -> None:
    exc = refusal(lambda: canonicalize(payload))
    assert isinstance(exc, PayloadNotCanonicalizable)
    cause = exc.__cause__
    assert cause is not None and str(cause)
    assert exc.fields["reason"] == str(cause)  # the structured reason is the canonicaliser's own
    assert str(cause) in str(exc)


def test_a_canonical_form_that_is_not_utf8_is_refused_never_leaked_as_a_decode_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # rfc8785 refuses lone surrogates itself today; should it ever emit them, the ledger
    # must still answer with its own typed refusal, never a UnicodeDecodeError
    monkeypatch.setattr(rfc8785, "dumps", lambda payload: b'{"x":"\xed\xa0\x80"}')
    exc = refusal(lambda: canonicalize({"x": "anything"}))
    assert isinstance(exc, PayloadNotCanonicalizable)
    assert exc.fields["reason"] == "invalid_unicode"
    assert "Unicode" in str(exc)


# -- the answer does not depend on where the offence sits, nor on the caller's stack --------


json_scalars = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)
OFFENCES: list[tuple[Any, type[Exception]]] = [
    (nested(MAX_DEPTH), PayloadTooDeep),
    ([0] * (MAX_ITEMS + 1), PayloadTooLarge),
    ("y" * 1000, PayloadTooLarge),
]


@settings(max_examples=60, deadline=None)
@given(
    siblings=st.lists(json_values, max_size=5),
    position=st.integers(0, 5),
    offence=st.sampled_from(OFFENCES),
)
def test_an_offending_value_is_found_wherever_it_sits(
    siblings: list[Any], position: int, offence: tuple[Any, type[Exception]]
) -> None:
    value, error = offence
    members = [(f"s{i}", v) for i, v in enumerate(siblings)]
    members.insert(min(position, len(members)), ("bad", value))
    with pytest.raises(error):
        canonicalize(dict(members), max_bytes=999)


def test_a_caller_deep_in_its_own_stack_gets_the_same_answer() -> None:
    deepest = nested(MAX_DEPTH, innermost="leaf")
    # the precondition: this close to the limit, serialising it in place overflows
    with pytest.raises(RecursionError):
        near_the_recursion_limit(lambda: rfc8785.dumps(deepest))
    assert near_the_recursion_limit(lambda: canonicalize(deepest)) == canonicalize(deepest)

    not_json = nested(MAX_DEPTH, innermost=math.nan)
    shallow = refusal(lambda: canonicalize(not_json))
    deep = refusal(lambda: near_the_recursion_limit(lambda: canonicalize(not_json)))
    assert isinstance(shallow, PayloadNotCanonicalizable)
    assert isinstance(deep, PayloadNotCanonicalizable)
    assert (type(deep), deep.fields) == (type(shallow), shallow.fields)
    assert str(deep) == str(shallow)
