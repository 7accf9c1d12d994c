"""The sandbox's admin routes (`/_admin/...`): what tests and the contract check drive and
read. The ground truth, a reset, a restart, each account's switches, the faults to
inject (a case closed by someone else is the CRM's: `crm.ROUTES`)."""

from __future__ import annotations

from dataclasses import asdict, replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import state as _state
from .keyed import error_response
from .state import FAULT_MODES, FRONT_DOOR, LIMITED_PROVIDERS, Fault, current


async def admin_truth(request: Request) -> Response:
    state = current()
    return JSONResponse(
        {
            "effects": dict(state.effects),
            "by_act": dict(state.by_act),
            "requests": {k: v for k, v in state.requests.items()},
            "limited": {account: lim.report() for account, lim in state.limiters.items()},
        }
    )


async def admin_restart(request: Request) -> Response:
    """The provider restarts: accounts whose key store is not durable forget every key."""
    state = current()
    forgotten = [k for k in state.keys if not state.config_for(k[1]).keys_durable]
    for k in forgotten:
        del state.keys[k]
    return JSONResponse({"ok": True, "keys_forgotten": len(forgotten)})


async def admin_reset(request: Request) -> Response:
    _state.reset()
    return JSONResponse({"ok": True})


async def admin_config(request: Request) -> Response:
    state = current()
    changes = await request.json()
    account = changes.pop("account", None)
    config = state.config
    if account is not None:
        config = state.accounts.setdefault(account, replace(state.config))
    for name, value in changes.items():
        if not hasattr(config, name):
            return error_response(400, "unknown_setting", name)
        setattr(config, name, type(getattr(config, name))(value))
    return JSONResponse(asdict(config))


async def admin_fault(request: Request) -> Response:
    spec = await request.json()
    if spec.get("mode") not in FAULT_MODES:
        return error_response(400, "unknown_fault", str(spec.get("mode")))
    if spec["mode"] in FRONT_DOOR and spec.get("provider") not in LIMITED_PROVIDERS:
        return error_response(
            400, "unknown_fault", f"{spec['mode']} strikes only {', '.join(LIMITED_PROVIDERS)}"
        )
    state = current()
    state.faults.append(Fault(**spec))
    return JSONResponse({"ok": True, "pending": len(state.faults)})


ROUTES = [
    Route("/_admin/truth", admin_truth, methods=["GET"]),
    Route("/_admin/reset", admin_reset, methods=["POST"]),
    Route("/_admin/restart", admin_restart, methods=["POST"]),
    Route("/_admin/config", admin_config, methods=["POST"]),
    Route("/_admin/faults", admin_fault, methods=["POST"]),
]
