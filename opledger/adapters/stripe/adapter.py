"""`StripeAdapter`: the secret key, the actions' schemas and descriptions, and the
adapter's two calls, dispatch and lookup, which never raise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from pydantic import SecretStr

from opledger.ledger import Attempt, Claim, Operation, Outcome, Rejected
from opledger.ledger.contract import Contract
from opledger.net import api_key_problem

from ..base import (
    INCONCLUSIVE,
    LookupResult,
    http_client,
    outcome_for_http_error,
    reuses_connections,
    scoped,
)
from .answers import outcome_of
from .contract import ACTIONS, CHARGE, OP_MARKER, PAYMENT_INTENT, REFUND, key_scope, stripe_contract
from .lookup import look_up
from .request import request_for
from .schemas import CHARGE_SCHEMA, PAYMENT_INTENT_SCHEMA, REFUND_SCHEMA


class StripeAdapter:
    """PaymentIntents, charges and refunds in one Stripe account (the secret key's)."""

    actions = ACTIONS

    def __init__(
        self,
        base_url: str,
        *,
        api_key: SecretStr | str,
        contract: Contract | None = None,
        stripe_version: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._key = api_key if isinstance(api_key, SecretStr) else SecretStr(api_key)
        secret = self._key.get_secret_value()
        problem = api_key_problem(secret)
        if problem is not None:  # said without the key
            raise ValueError(f"a Stripe adapter needs a secret key, and this one {problem}")
        self.account = key_scope(secret, self.base_url)
        self.contract = scoped(contract or stripe_contract(), self.account)
        self._version = stripe_version
        # Stripe's test mode is the same endpoint under a test key: `contract check` may
        # send its probes there, never with a live key
        self.test_base_url = self.base_url if "_test_" in secret else None
        self.intent_fields = {
            PAYMENT_INTENT: ("amount", "currency", "customer", "payment_method"),
            CHARGE: ("amount", "currency", "customer", "source"),
            REFUND: ("amount",),
        }
        # how wide one act is. A refund's target is Stripe's own object (the charge or
        # PaymentIntent refunded): the same amount of the same payment refunded again is
        # almost always the same refund asked twice (a re-planning agent, a second thread
        # on the same ticket), so it is one act for the tenant whatever run asks; a second
        # refund of that amount on purpose says so (`purpose`, a tool's `repeat`). A
        # payment's target is the caller's own reference, which a later run may reuse for
        # a payment it means (a renewal, a checkout the customer starts again): one act
        # per run. A deployment whose reference names one payment for good (an order id)
        # widens it: OPLEDGER_INTENT_SCOPES=stripe.payment_intent.v1=tenant.
        self.intent_scopes = {REFUND: "tenant"}
        self.payload_schemas = {
            PAYMENT_INTENT: PAYMENT_INTENT_SCHEMA,
            CHARGE: CHARGE_SCHEMA,
            REFUND: REFUND_SCHEMA,
        }
        self.descriptions = {
            PAYMENT_INTENT: (
                "Charge a customer's payment method through a Stripe PaymentIntent, confirmed "
                "at once; the target is your reference for what is paid (an order or "
                "invoice id). Another amount, currency, customer or payment method is "
                "another payment; the same ones asked again are not charged twice."
            ),
            CHARGE: (
                "Charge a card token or a customer's default card with Stripe's Charges API; "
                "the target is your reference for what is paid. Another amount, currency, "
                "customer or source is another payment."
            ),
            REFUND: (
                "Refund a Stripe payment; the target is the PaymentIntent (pi_...) or "
                "charge (ch_...) id. Another amount is another refund; the same amount of "
                "the same payment is one refund, whoever asks for it."
            ),
        }
        self._client = http_client(
            self.contract.request_timeout.total_seconds(),
            reuse=reuses_connections(self.contract),
        )

    def __repr__(self) -> str:  # never the key
        return f"StripeAdapter({self.base_url!r}, account={self.account!r})"

    def _headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self._key.get_secret_value()}"}
        if self._version:
            headers["Stripe-Version"] = self._version
        return headers

    # -- dispatch --------------------------------------------------------------------------

    def dispatch(self, claim: Claim) -> Outcome:
        op = claim.operation
        if op.action not in ACTIONS:
            return Rejected(
                code="unsupported_action", reason=f"the Stripe adapter has no {op.action}"
            )
        try:
            path, params = request_for(op, claim.payload)
        except ValueError as exc:  # refused here: nothing was sent
            return Rejected(code="invalid_payload", reason=str(exc)[:500])
        try:
            response = self._client.post(
                f"{self.base_url}{path}",
                content=urlencode(params).encode(),
                headers={
                    **self._headers(),
                    "Idempotency-Key": claim.idempotency_key,
                    "Content-Type": "application/x-www-form-urlencoded",
                },
            )
            return outcome_of(claim, response)
        except Exception as exc:  # mapped at the edge, never leaked
            failed = outcome_for_http_error(exc)
            return failed.model_copy(update={"reason": self._scrubbed(failed.reason)})

    def _scrubbed(self, text: str) -> str:
        """`text` without the secret key (an exception may quote a header it refused)."""
        return text.replace(self._key.get_secret_value(), "[the secret key]")

    # -- lookup ----------------------------------------------------------------------------

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        try:
            return look_up(self._client, self.base_url, self._headers(), operation)
        except Exception as exc:  # a failed read is no evidence
            return LookupResult(
                verdict=INCONCLUSIVE,
                detail={"error": self._scrubbed(outcome_for_http_error(exc).reason)},
            )

    def search_hint(self, operation: Operation) -> str | None:
        """What to search for in the Stripe dashboard (or its Search API)."""
        return f"metadata['{OP_MARKER}']:'{operation.marker}'"

    def contract_probe(self, variant: int) -> tuple[str, str, dict[str, Any]]:
        """What `opledger contract check` sends (test mode only): a charge of Stripe's test
        card token, whose amount differs with `variant`."""
        return (
            CHARGE,
            "opledger-contract-check",
            {"amount": 1000 + variant, "currency": "usd", "source": "tok_visa"},
        )

    def close(self) -> None:
        self._client.close()
