"""The hint `opledger contract check` prints for each disagreement: the field, its value,
what the probe saw, and whether the declared fact over-promised (a duplicate's way through)
or was only more cautious than the provider."""

from __future__ import annotations

import pytest

from opledger.adapters.hints import hint_for
from opledger.adapters.presets import EXPRESS_IDEMPOTENCY, STRIPE_V1
from opledger.ledger.contract import Lookup

WITH_LOOKUP = EXPRESS_IDEMPOTENCY.model_copy(update={"lookup": Lookup(kind="status_api")})


@pytest.mark.parametrize(
    ("fact", "declared", "observed", "change", "over"),
    [
        ("after_error", "replayed", "key_released", 'idempotency.after_error="key_released"', True),
        ("after_error", "nothing_applied", "replayed", 'idempotency.after_error="replayed"', True),
        ("after_error", "key_released", "replayed", 'idempotency.after_error="replayed"', False),
        ("keys_durable", "true", "the key was forgotten", "idempotency.keys_durable=False", True),
        ("keys_durable", "false", "the key survived", "idempotency.keys_durable=True", False),
        ("idempotency", "keyed", "applied twice under one key", 'kind="none"', True),
        ("idempotency", "none", "answered from the key", 'idempotency.kind="keyed"', False),
        ("payload_checked", "true", "not refused: success c_1", "payload_checked=False", True),
        ("payload_checked", "false", "refused as another payload", "payload_checked=True", False),
        ("concurrent", "conflict", "both executed", 'concurrent="unchecked"', True),
        (
            "concurrent",
            "conflict",
            "the second was refused as in progress after 1.5 s",
            "conflict_wait=timedelta(seconds=1.5)",
            True,
        ),
        ("concurrent", "unchecked", "the second was refused", 'concurrent="conflict"', False),
        ("response_binds", "key_and_digest", "key", 'response_binds="key"', True),
        ("response_binds", "nothing", "key", 'response_binds="key"', False),
        ("response_binds", "key", "another body's digest", "the adapter's success binding", True),
        (
            "max_key_length",
            "255",
            "a 255-character key: ambiguous http_400",
            "max_key_length",
            True,
        ),
        (
            "lookup",
            "status_api",
            "inconclusive for the request just made",
            'lookup.kind="search"',
            True,
        ),
        ("lookup", "search", "rejected the request just made", "the adapter's lookup", True),
        (
            "lookup_absent",
            "absent",
            "inconclusive for a request never made",
            'lookup.kind="search"',
            True,
        ),
        (
            "lookup_absent",
            "not found",
            "confirmed for a request never made",
            "the adapter's lookup",
            True,
        ),
        (
            "lookup_binds",
            "this operation",
            "target: not enough to confirm it",
            "lookup binding",
            True,
        ),
    ],
)
def test_each_disagreement_names_its_change(
    fact: str, declared: str, observed: str, change: str, over: bool
) -> None:
    hint = hint_for(fact, declared, observed, STRIPE_V1)
    assert hint is not None
    assert change in hint.change, hint
    assert hint.over_promises is over, hint
    assert str(hint).startswith(f"{hint.change}: ")


def test_a_missing_lookup_is_named_where_a_released_or_forgotten_key_is_seen() -> None:
    """Without a lookup, an honest `key_released` or non-durable contract sends every lost
    answer to a person: the hint says what makes it safe and live."""
    for fact, declared, observed in (
        ("after_error", "replayed", "key_released"),
        ("keys_durable", "true", "the key was forgotten"),
    ):
        without = hint_for(fact, declared, observed, EXPRESS_IDEMPOTENCY)
        with_lookup = hint_for(fact, declared, observed, WITH_LOOKUP)
        assert without is not None and with_lookup is not None
        assert 'lookup.kind="status_api"' in without.why
        assert "lookup" not in with_lookup.why


def test_an_unknown_fact_or_an_unclear_observation_has_no_hint() -> None:
    assert hint_for("probe", "a success", "ambiguous http_500", STRIPE_V1) is None
    assert hint_for("after_error", "replayed", "unclear (x; then y)", STRIPE_V1) is None
