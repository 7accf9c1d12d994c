"""The sandbox's email: an API over HTTP (sends behind the front door and the idempotency
layer, a search of sent messages that lags) and an SMTP server's handler."""

from __future__ import annotations

import time
from email import message_from_bytes
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .keyed import error, keyed_request, limited
from .state import current


async def email_send(request: Request) -> Response:
    state = current()
    account = request.path_params["account"]

    def execute(
        payload: dict[str, Any], key: str | None, digest: str
    ) -> tuple[int, dict[str, Any]]:
        if not payload.get("to") or "@" not in str(payload.get("to")):
            return error(422, "validation_error", "a recipient address is required")
        message_id = f"msg_{len(state.messages) + 1:06d}"
        state.messages.append(
            {
                "id": message_id,
                "account": account,
                "marker": payload.get("marker"),
                "key": key,
                "to": payload.get("to"),
                "accepted_at": time.time(),
                "last_event": "accepted",
            }
        )
        state.effects[f"email:{key or payload.get('marker')}"] += 1
        state.by_act[f"email:{account}:{payload.get('to')}"] += 1
        return 202, {"id": message_id}

    return await limited(
        request,
        state,
        "email",
        account,
        lambda: keyed_request(
            request,
            state,
            "email",
            account,
            execute,
            mismatch=(409, "invalid_idempotent_request"),
            conflict=(409, "concurrent_idempotent_requests"),
        ),
    )


async def email_sent_search(request: Request) -> Response:
    state, account = current(), request.path_params["account"]
    marker = request.query_params.get("marker")
    horizon = time.time() - state.config_for(account).search_lag_s
    hits = [
        m
        for m in state.messages
        if m["account"] == account and m["marker"] == marker and m["accepted_at"] <= horizon
    ]
    return JSONResponse({"data": hits})


ROUTES = [
    Route("/email/{account}/send", email_send, methods=["POST"]),
    Route("/email/{account}/sent", email_sent_search, methods=["GET"]),
]


# -- SMTP -----------------------------------------------------------------------------------


class SmtpHandler:
    """Accepts every message, counts it by Message-ID, and can drop after DATA."""

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        state = current()
        message = message_from_bytes(envelope.original_content or envelope.content)
        message_id = str(message.get("Message-ID", "")).strip()
        fault = state.take_fault("smtp", message_id)
        if fault is not None and fault.mode in ("refuse_after_data", "defer_after_data"):
            code = 554 if fault.mode == "refuse_after_data" else 451
            state.requests[f"smtp:{message_id}"].append(
                {"arrived": time.time(), "completed": time.time(), "status": code}
            )
            return f"{code} sandbox fault: message not accepted"
        state.effects[f"smtp:{message_id}"] += 1
        state.requests[f"smtp:{message_id}"].append(
            {"arrived": time.time(), "completed": time.time(), "status": 250}
        )
        if fault is not None and fault.mode == "drop_after_data":
            server.transport.close()
        return "250 2.0.0 Message accepted for delivery"
