"""The sandbox CRM: case actions (close, update) behind the front door and the idempotency
layer, the case itself, a status API by key, a search that lags, and edits by someone
else."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .keyed import error, error_response, keyed_request, limited
from .state import current


async def crm_case_action(request: Request) -> Response:
    state = current()
    account = request.path_params["account"]
    case_id = request.path_params["case_id"]
    verb = request.path_params["verb"]

    def execute(
        payload: dict[str, Any], key: str | None, digest: str
    ) -> tuple[int, dict[str, Any]]:
        case = state.cases[(account, case_id)]
        if case_id.startswith("missing-"):
            return error(404, "case_not_found", f"no case {case_id}")
        if verb == "close":
            if case.status == "closed":
                return error(409, "case_already_closed", f"closed by {case.closed_by}")
            case.status, case.closed_by = "closed", "api"
        case.fields.update(payload.get("fields", {}))
        if "note" in payload:
            case.fields["note"] = payload["note"]
        case.version += 1
        case.last_key, case.last_digest, case.applied_at = key, digest, time.time()
        state.effects[f"crm:{key}"] += 1
        state.by_act[f"crm:{account}:{verb}:{case_id}"] += 1
        return 200, {
            "case_id": case_id,
            "status": case.status,
            "version": case.version,
            "idempotency_key": key,
            "request_digest": digest,
        }

    return await limited(
        request,
        state,
        "crm",
        account,
        lambda: keyed_request(
            request,
            state,
            "crm",
            account,
            execute,
            mismatch=(422, "idempotency_key_reused"),
            conflict=(409, "idempotency_key_in_use"),
        ),
    )


async def crm_request_status(request: Request) -> Response:
    state = current()
    if not state.config_for(request.path_params["account"]).status_api:
        return error_response(501, "not_supported")
    account, key = request.path_params["account"], request.path_params["key"]
    entry = state.key_entry("crm", account, key)
    if entry is not None and entry.state == "in_progress":
        return JSONResponse({"state": "in_progress"}, status_code=202)
    applied = state.applied.get(("crm", account, key))
    if applied is not None:  # the change was made, whatever the response said
        return JSONResponse({"state": "done", "applied": True, **applied})
    if entry is None:
        return error_response(404, "no_such_request")
    return JSONResponse(
        {
            "state": "done",
            "applied": False,
            "status_code": entry.status_code,
            "response": entry.body,
        }
    )


async def crm_get_case(request: Request) -> Response:
    case = current().cases[(request.path_params["account"], request.path_params["case_id"])]
    return JSONResponse({"case_id": request.path_params["case_id"], **asdict(case)})


async def crm_search(request: Request) -> Response:
    state, account = current(), request.path_params["account"]
    key = request.query_params.get("key")
    horizon = time.time() - state.config_for(account).search_lag_s
    hits = [
        {"case_id": case_id, **asdict(case)}
        for (acct, case_id), case in list(state.cases.items())
        if acct == account and case.last_key == key and case.applied_at <= horizon
    ]
    return JSONResponse({"results": hits})


async def crm_close_by_other(request: Request) -> Response:
    """Someone else closes the case (not through opledger): an admin route."""
    case = current().cases[(request.path_params["account"], request.path_params["case_id"])]
    case.status, case.closed_by, case.version = "closed", "someone-else", case.version + 1
    case.last_key, case.last_digest, case.applied_at = None, None, time.time()
    return JSONResponse(asdict(case))


ROUTES = [
    Route("/crm/{account}/cases/{case_id}/{verb:str}", crm_case_action, methods=["POST"]),
    Route("/crm/{account}/cases/{case_id}", crm_get_case, methods=["GET"]),
    Route("/crm/{account}/requests/{key}", crm_request_status, methods=["GET"]),
    Route("/crm/{account}/search", crm_search, methods=["GET"]),
    Route(
        "/_admin/crm/{account}/cases/{case_id}/close_by_other",
        crm_close_by_other,
        methods=["POST"],
    ),
]
