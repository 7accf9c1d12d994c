"""The presets: each a valid contract that says where its facts come from, and the
middlewares' presets saying what those middlewares do (express-idempotency 1.0.6 as its
source reads; a middleware that follows the IETF Idempotency-Key draft, durably), read by
the decision as they must be."""

from __future__ import annotations

from datetime import timedelta

import pytest

from opledger.adapters.presets import EXPRESS_IDEMPOTENCY, IETF_IDEMPOTENCY_KEY, PRESETS
from opledger.ledger.contract import Contract, Lookup
from opledger.ledger.decide import AskProvider, Dispatch, NeedsReview, decide

from .histories import T0, attempt, evidence, grant, operation

AFTER = T0 + timedelta(minutes=5)  # past every attempt's deadline


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_is_a_contract_with_its_source(name: str) -> None:
    contract = PRESETS[name]
    assert contract.provider == name
    assert len(contract.source) > 40, name
    assert Contract.model_validate(contract.model_dump()) == contract  # passes its checks
    if contract.idempotency.kind == "keyed":
        assert contract.idempotency.retention is not None, name


def test_express_idempotency_releases_keys_forgets_them_and_offers_no_lookup() -> None:
    idem = EXPRESS_IDEMPOTENCY.idempotency
    assert (idem.after_error, idem.keys_durable) == ("key_released", False)
    assert idem.payload_checked and idem.concurrent == "conflict"  # its 417 and 409
    assert idem.conflict_wait == timedelta(0)  # the 409 comes at once
    assert EXPRESS_IDEMPOTENCY.lookup.kind == "none"
    assert "417" in EXPRESS_IDEMPOTENCY.source and "restart" in EXPRESS_IDEMPOTENCY.source


def test_ietf_draft_middleware_replays_what_it_stored_and_keeps_keys() -> None:
    idem = IETF_IDEMPOTENCY_KEY.idempotency
    assert (idem.after_error, idem.keys_durable) == ("replayed", True)
    assert idem.payload_checked and idem.concurrent == "conflict"
    for status in ("409", "422", "400"):
        assert status in IETF_IDEMPOTENCY_KEY.source


def test_after_a_5xx_express_idempotency_is_never_resent_blind() -> None:
    """A 500 after the route committed: the key is gone. Without a lookup a person
    decides; with one that reads the API's own records, it is asked first."""
    failed = [evidence("ambiguous", source="dispatch", attempt_n=1, code="server_error")]
    alone = decide(EXPRESS_IDEMPOTENCY, operation(), [attempt()], failed, grant(), AFTER)
    assert isinstance(alone, NeedsReview), alone
    looked = EXPRESS_IDEMPOTENCY.model_copy(update={"lookup": Lookup(kind="status_api")})
    asked = decide(looked, operation(), [attempt()], failed, grant(), AFTER)
    assert isinstance(asked, AskProvider), asked
    # an over-promising reading of the same middleware resends under the released key
    naive = EXPRESS_IDEMPOTENCY.model_copy(
        update={
            "idempotency": EXPRESS_IDEMPOTENCY.idempotency.model_copy(
                update={"after_error": "nothing_applied", "keys_durable": True}
            )
        }
    )
    assert isinstance(decide(naive, operation(), [attempt()], failed, grant(), AFTER), Dispatch)
