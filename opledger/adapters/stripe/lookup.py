"""The lookup: Stripe has no lookup by idempotency key, so our marker is read back from a
list (Stripe's read-after-write path), and from Search (which lags) only where the list
is too long to read. Finding the marker confirms; not finding it proves nothing."""

from __future__ import annotations

from typing import Any

import httpx

from opledger.ledger import Operation

from ..base import CONFIRMED, INCONCLUSIVE, REJECTED, LookupResult
from .answers import accepted_only, binding, contradiction, declined, error_of, marker_of, result_of
from .contract import (
    CREATED_SLACK,
    LIST_PAGE,
    LIST_PAGES,
    OP_MARKER,
    PAYMENT_INTENT,
    REFUND,
    STATUS_CONFIRMED,
)


def look_up(
    client: httpx.Client, base_url: str, headers: dict[str, str], operation: Operation
) -> LookupResult:
    """What Stripe holds under `operation`'s marker (an error reading it is the caller's)."""
    action = operation.action
    if action == REFUND:
        field = "payment_intent" if operation.target.startswith("pi_") else "charge"
        path, params = "/v1/refunds", {field: operation.target}
    else:
        path = "/v1/payment_intents" if action == PAYMENT_INTENT else "/v1/charges"
        since = int((operation.created_at - CREATED_SLACK).timestamp())
        params = {"created[gte]": str(since)}
    found: list[dict[str, Any]] = []
    pages, after, complete = 0, None, False
    while pages < LIST_PAGES:
        query = {**params, "limit": str(LIST_PAGE)}
        if after:
            query["starting_after"] = after
        response = client.get(f"{base_url}{path}", params=query, headers=headers)
        if response.status_code != 200:
            return LookupResult(
                verdict=INCONCLUSIVE,
                detail={
                    "source": "list",
                    "status": response.status_code,
                    "code": error_of(response).get("code", ""),
                },
            )
        page = response.json()
        data = [o for o in page.get("data", []) if isinstance(o, dict)]
        found += [o for o in data if marker_of(o) == operation.marker]
        pages += 1
        if not page.get("has_more") or not data:
            complete = True
            break
        after = str(data[-1].get("id"))
    source = "list"
    if not found and not complete and action != REFUND:
        source = "search"  # too many to read: Stripe's search, which lags
        response = client.get(
            f"{base_url}{path}/search",
            params={"query": f"metadata['{OP_MARKER}']:'{operation.marker}'", "limit": "10"},
            headers=headers,
        )
        if response.status_code == 200:
            found = [o for o in response.json().get("data", []) if marker_of(o) == operation.marker]
    return verdict_of(operation, found, source, pages)


def verdict_of(
    operation: Operation, found: list[dict[str, Any]], source: str, pages: int
) -> LookupResult:
    """What the objects found under the marker say of `operation`."""
    if not found:
        # absence proves nothing: a search lags, and a request answered with a 500 may
        # still be completed by Stripe
        return LookupResult(
            verdict=INCONCLUSIVE, detail={"source": source, "hits": 0, "pages": pages}
        )
    applied = [o for o in found if str(o.get("status", "")) in STATUS_CONFIRMED[operation.action]]
    for obj in applied:
        if contradiction(operation, None, obj) is None:
            return LookupResult(
                verdict=CONFIRMED,
                binding=binding(operation, obj, operation.idempotency_key),
                result=result_of(obj),
                detail={"source": source, "hits": len(found), "accepted_only": accepted_only(obj)},
            )
    refused = [o for o in found if declined(operation.action, o)]
    if refused and len(refused) == len(found):
        # Stripe ran our request and declined it; the key replays that decline
        return LookupResult(
            verdict=REJECTED,
            binding=binding(operation, refused[0], operation.idempotency_key),
            detail={"source": source, "result": result_of(refused[0]), "code": "declined"},
        )
    return LookupResult(
        verdict=INCONCLUSIVE,
        detail={
            "source": source,
            "hits": len(found),
            "statuses": sorted({str(o.get("status")) for o in found}),
        },
    )
