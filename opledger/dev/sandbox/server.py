"""Simulated providers as real servers: a CRM and an email API over HTTP, and SMTP.

They behave like the real providers the contracts describe (docs/contracts.md), and every
protection they offer is a switch, so a test can prove that opledger (not the provider)
prevented a duplicate:

- idempotency keys per account with a retention window; the first response is stored and
  replayed, a 500 included (as Stripe's v1 API does); another payload under a used key is
  refused (CRM 422, email 409 with its own error code); a request arriving while the first
  one with its key executes gets a 409 (switchable);
- a status API by key (CRM), a search that lags (both), edits by "other users" (CRM);
- per-request faults: commit then drop the response, commit then answer too late, a 500
  before or after the commit, a 503 "overloaded" with Retry-After before anything; SMTP
  can drop the connection after accepting DATA;
- per-account limits on the writes (CRM case actions, email sends): requests in flight at
  once, and a rate with a burst (a token bucket); a request over either gets a 429 with
  Retry-After before its key is read or anything is applied;
- ground truth: how many times each effect was applied, every admitted request per key
  with its arrival and completion times, and per account what its limits admitted and
  refused.

Run it with `opledger sandbox` or `python -m opledger.dev.sandbox`; tests use
`opledger.dev.sandbox.Sandbox`. State is in memory and starts empty.

This module builds the app (and holds the webhook receiver); the parts: `state` (the
switches, faults, keys and ground truth), `keyed` (the front door and the idempotency
layer every write passes), `crm`, `mail` (email over HTTP and SMTP), `admin`.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from . import admin, crm, mail
from .keyed import keyed_request
from .state import current

# -- a webhook receiver ---------------------------------------------------------------------


async def webhook_receive(request: Request) -> Response:
    """Counts deliveries per Idempotency-Key; deduplicates by it when keys are on."""
    state = current()
    name = request.path_params["name"]

    def execute(
        payload: dict[str, Any], key: str | None, digest: str
    ) -> tuple[int, dict[str, Any]]:
        state.effects[f"webhook:{key}"] += 1
        state.messages.append({"webhook": name, "key": key, "payload": payload, "at": time.time()})
        return 200, {"received": True}

    return await keyed_request(
        request,
        state,
        "webhook",
        name,
        execute,
        mismatch=(422, "idempotency_key_reused"),
        conflict=(409, "in_progress"),
    )


def build_app() -> Starlette:
    """The HTTP providers and the admin routes, as one app."""
    webhook = [Route("/webhook/{name}", webhook_receive, methods=["POST"])]
    return Starlette(routes=[*crm.ROUTES, *mail.ROUTES, *webhook, *admin.ROUTES])
