"""The MCP gateway over real streamable HTTP (uvicorn on loopback, the MCP SDK's client),
on the real ledger: the caller's token decides the tenant and the grant; a call is an act
of the caller's run; a call asked again under a new request id is answered with the same
operation; a call that cannot be an effect is refused and writes nothing.

No worker runs here (publishing is recorded, not sent): what a worker does with the
operation, and a gateway killed mid-call, are tests/system/test_mcp_gateway.py's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import RequestParamsMeta
from mcp_types.jsonrpc import INVALID_PARAMS

from opledger.adapters.crm import CrmAdapter
from opledger.adapters.email import EmailAdapter
from opledger.adapters.registry import Registry
from opledger.agents.effects import Effects
from opledger.dev.processes import free_port
from opledger.ledger import Binding, Confirmed, Ledger
from opledger.mcp.clients import Caller, Clients, add_client
from opledger.mcp.server import Gateway, http_app, identify_by_token
from opledger.mcp.tools import ACTION_META, RUN_META, STATUS_TOOL, TOOL_NAME_RE

pytestmark = pytest.mark.timeout(120)


@dataclass
class Gw:
    url: str
    tokens: dict[str, str]
    published: list[str]
    ledger: Ledger


@pytest.fixture
def gw(ledger: Ledger, grant: str, tmp_path: Path) -> Iterator[Gw]:
    ledger.grant(tenant="globex", scope=["crm.*"], granted_by="test", ref="auth_globex")
    ledger.grant(tenant="acme", scope=["crm.*"], granted_by="test", ref="auth_revoked")
    ledger.revoke("auth_revoked", by="security", reason="the agent misbehaved")
    ledger.grant(tenant="acme", scope=["email.*"], granted_by="test", ref="auth_mail")
    registry = Registry(
        [
            CrmAdapter("http://127.0.0.1:9", account="acme"),
            EmailAdapter("http://127.0.0.1:9", account="acme"),
        ]
    )
    path = tmp_path / "clients.json"
    tokens = {
        "bot": add_client(path, Caller("bot", "acme", grant)),
        "other": add_client(path, Caller("other", "globex", "auth_globex")),
        "revoked": add_client(path, Caller("revoked", "acme", "auth_revoked")),
        "helper": add_client(path, Caller("helper", "acme", grant)),  # another agent of acme
        "mailer": add_client(path, Caller("mailer", "acme", "auth_mail")),  # email.* only
    }
    published: list[str] = []
    effects = Effects(Ledger(ledger.engine, actions=registry), publish=published.append)
    gateway = Gateway(effects, registry, identify_by_token, wait=0.2)
    with serving(gateway, Clients(path)) as url:
        yield Gw(url, tokens, published, ledger)


@contextmanager
def serving(gateway: Gateway, clients: Clients) -> Iterator[str]:
    """`gateway` over streamable HTTP on a loopback port (uvicorn in a thread): its URL."""
    port = free_port()
    app = http_app(
        gateway, clients, host="127.0.0.1", path="/mcp", public_url=f"http://127.0.0.1:{port}"
    )
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        thread.join(10)


@asynccontextmanager
async def client(gw: Gw, token: str | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(gw.url, http_client=http)) as c,
    ):
        yield c


def call(
    gw: Gw, name: str, args: dict[str, Any], *, run: str | None = "run-1", token: str = "bot"
) -> Any:
    async def go() -> Any:
        async with client(gw, gw.tokens[token]) as c:
            meta = cast(RequestParamsMeta, {RUN_META: run}) if run is not None else None
            try:
                return await c.call_tool(name, args, meta=meta)
            except MCPError as exc:  # returned, not raised through the client's task group
                return exc

    return anyio.run(go)


CLOSE: dict[str, Any] = {"target": "case-318", "payload": {"note": "resolved by the agent"}}


def test_the_tools_are_the_actions_with_their_schemas_and_the_status_tool(gw: Gw) -> None:
    async def go() -> Any:
        async with client(gw, gw.tokens["bot"]) as c:
            return await c.list_tools()

    tools = {t.name: t for t in anyio.run(go).tools}
    assert set(tools) == {
        "crm_close_case_v1",
        "crm_update_case_v1",
        "email_send_v1",
        STATUS_TOOL,
    }
    update = tools["crm_update_case_v1"]
    assert update.input_schema["required"] == ["target", "payload"]
    assert update.input_schema["properties"]["payload"]["required"] == ["fields"]
    assert "payload's fields" in (update.description or "")
    assert update.annotations is not None and update.annotations.idempotent_hint
    # named as model APIs name a function; the action is in what a reader of the tool sees
    assert all(TOOL_NAME_RE.fullmatch(name) for name in tools)
    assert update.meta is not None and update.meta[ACTION_META] == "crm.update_case.v1"
    assert "crm.update_case.v1" in (update.description or "")


def test_a_call_naming_the_action_or_the_old_status_tool_is_served_as_its_tool(gw: Gw) -> None:
    """The names 0.1.0 offered (the action itself, `opledger.status`) are not listed, and a
    call that names them is the same act as its tool's."""
    first = call(gw, "crm_close_case_v1", CLOSE).structured_content
    legacy = call(gw, "crm.close_case.v1", CLOSE)
    assert not legacy.is_error, legacy
    assert legacy.structured_content["op_id"] == first["op_id"]
    assert legacy.structured_content["asked_before"] is True
    status = call(gw, "opledger.status", {"op_id": first["op_id"]})
    assert not status.is_error and status.structured_content["op_id"] == first["op_id"]
    assert len(gw.ledger.list(limit=10)) == 1


def test_a_call_is_an_effect_and_the_same_call_under_a_new_request_id_is_answered_with_it(
    gw: Gw,
) -> None:
    first = call(gw, "crm_close_case_v1", CLOSE)
    assert not first.is_error
    answer = first.structured_content
    assert answer["kind"] == "pending" and answer["asked_before"] is False
    op = gw.ledger.get(answer["op_id"])
    assert (op.tenant, op.workflow_id, op.authorization_ref) == (
        "acme",
        "mcp:bot:run-1",
        "auth_acme",
    )
    # the client lost the answer and re-issues the call: a new connection, a new request id,
    # reworded: the same act, the same operation, nothing new published
    again = call(gw, "crm_close_case_v1", {**CLOSE, "payload": {"note": "closing it now"}})
    assert again.structured_content["op_id"] == op.id
    assert again.structured_content["asked_before"] is True
    assert again.structured_content["differs"] == ["payload.note"]
    assert set(gw.published) == {op.id}  # (a waiting call may publish it again: one message)
    asks = gw.ledger.asks(op.id)  # each ask kept, with the caller and its request id
    assert len(asks) == 2 and all(str(a.asked_by).startswith("mcp:bot:") for a in asks)
    # a deliberate repeat is another act
    repeat = call(gw, "crm_close_case_v1", {**CLOSE, "repeat": 2})
    second = repeat.structured_content["op_id"]
    assert second != op.id
    # once it is done, asking repeat 2 again names the next repeat: 3, never 2 again
    claim = gw.ledger.claim(second, owner="test-worker")
    assert claim is not None
    bound = Binding(idempotency_key=claim.idempotency_key, target=claim.operation.target)
    gw.ledger.record_outcome(claim, Confirmed(receipt_id="case@v2", binding=bound))
    told = call(gw, "crm_close_case_v1", {**CLOSE, "repeat": 2}).structured_content
    assert (told["op_id"], told["kind"]) == (second, "confirmed")
    assert "`repeat` set to 3" in told["message"], told["message"]


def test_a_tenant_wide_act_is_one_act_whichever_agent_and_run_asks(gw: Gw) -> None:
    """Closing a case is the tenant's act (crm.close_case.v1's intent scope): another
    agent's run asking it is answered with the first run's operation, whose status it may
    follow; a caller whose grant does not cover the action is refused, never answered; an
    update (one act per run) in another run is another act."""
    first = call(gw, "crm_close_case_v1", CLOSE).structured_content
    op = gw.ledger.get(first["op_id"])
    assert op.intent_scope == "tenant" and op.workflow_id == "mcp:bot:run-1"
    theirs = call(gw, "crm_close_case_v1", CLOSE, run="run-7", token="helper")
    answer = theirs.structured_content
    assert (answer["op_id"], answer["asked_before"]) == (op.id, True)
    assert "Run mcp:bot:run-1 already asked" in answer["message"]
    assert call(gw, "crm_close_case_v1", CLOSE, run="run-2").structured_content["op_id"] == op.id
    followed = call(gw, STATUS_TOOL, {"op_id": op.id}, token="helper")
    assert not followed.is_error and followed.structured_content["op_id"] == op.id
    out_of_scope = call(gw, "crm_close_case_v1", CLOSE, token="mailer")
    assert out_of_scope.is_error
    assert out_of_scope.structured_content["error"] == "OutOfScope"
    assert op.id not in str(out_of_scope.structured_content)
    assert len(gw.ledger.asks(op.id)) == 3  # the refused call asked nothing of it
    tools = _descriptions(gw)
    assert "whoever asks" in tools["crm_close_case_v1"]
    assert "in your run" in tools["crm_update_case_v1"]
    update = {"target": "case-318", "payload": {"fields": {"priority": "high"}}}
    mine = call(gw, "crm_update_case_v1", update).structured_content["op_id"]
    other = call(gw, "crm_update_case_v1", update, run="run-2").structured_content["op_id"]
    assert mine != other
    # another agent follows a tenant-wide act, never another run's own act
    assert call(gw, STATUS_TOOL, {"op_id": mine}, token="helper").is_error


def _descriptions(gw: Gw) -> dict[str, str]:
    async def go() -> Any:
        async with client(gw, gw.tokens["bot"]) as c:
            return await c.list_tools()

    return {t.name: t.description or "" for t in anyio.run(go).tools}


def test_the_status_tool_answers_for_the_callers_own_operations_only(gw: Gw) -> None:
    op_id = call(gw, "crm_close_case_v1", CLOSE).structured_content["op_id"]
    mine = call(gw, STATUS_TOOL, {"op_id": op_id})
    assert not mine.is_error and mine.structured_content["op_id"] == op_id
    theirs = call(gw, STATUS_TOOL, {"op_id": op_id}, token="other")
    assert theirs.is_error and "no operation" in theirs.structured_content["message"]
    # and another tenant's call of the same act in a run of the same name is its own act
    globex = call(gw, "crm_close_case_v1", CLOSE, token="other")
    assert globex.structured_content["op_id"] != op_id
    assert gw.ledger.get(globex.structured_content["op_id"]).tenant == "globex"


def _count(ledger: Ledger) -> int:
    return len(ledger.list(limit=1000))


@pytest.mark.parametrize(
    ("args", "run", "token", "error"),
    [
        ({"target": "case-1"}, "run-1", "bot", "InvalidArguments"),  # no payload
        # the payload is the ledger's to check: refused with the field it names
        ({"target": "case-1", "payload": {"note": 5}}, "run-1", "bot", "PayloadSchemaViolation"),
        ({"target": "", "payload": {}}, "run-1", "bot", "InvalidArguments"),
        (
            {"target": "case-1", "payload": {}, "tenant": "globex"},
            "run-1",
            "bot",
            "InvalidArguments",
        ),
        ({"target": "case-1", "payload": {}}, None, "bot", "MissingRun"),
        ({"target": "case-1", "payload": {}}, "run\x00", "bot", "InvalidIdentifier"),
        ({"target": "case-1", "payload": {}}, "run-1", "revoked", "AuthorizationRevoked"),
    ],
    ids=[
        "no-payload",
        "schema",
        "empty-target",
        "tenant-argument",
        "no-run",
        "bad-run",
        "revoked-grant",
    ],
)
def test_a_call_that_cannot_be_an_effect_is_refused_and_writes_nothing(
    gw: Gw, args: dict[str, Any], run: str | None, token: str, error: str
) -> None:
    before = _count(gw.ledger)
    result = call(gw, "crm_close_case_v1", args, run=run, token=token)
    assert result.is_error, result
    assert result.structured_content["kind"] == "refused"
    assert result.structured_content["error"] == error, result.structured_content
    assert "nothing was sent" in result.structured_content["message"]
    assert _count(gw.ledger) == before and gw.published == []


def test_an_act_asked_again_in_words_its_schema_refuses_is_answered_with_the_act(gw: Gw) -> None:
    first = call(gw, "crm_close_case_v1", CLOSE, run="run-1")
    assert not first.is_error, first
    misfit = {**CLOSE, "payload": {**CLOSE["payload"], "reason": "the model added it"}}
    again = call(gw, "crm_close_case_v1", misfit, run="run-1")
    assert not again.is_error, again  # never "nothing was sent": it was recorded
    answer = again.structured_content
    assert answer["op_id"] == first.structured_content["op_id"] and answer["asked_before"]
    assert "payload.reason" in answer["differs"]
    other = call(gw, "crm_close_case_v1", {**misfit, "target": "case-2"}, run="run-1")
    assert other.is_error and other.structured_content["error"] == "PayloadSchemaViolation"
    assert "'reason' was unexpected" in other.structured_content["message"]


def test_an_unknown_tool_is_a_protocol_error(gw: Gw) -> None:
    error = call(gw, "crm_delete_everything_v1", CLOSE)
    assert isinstance(error, MCPError)
    assert error.code == INVALID_PARAMS and "no tool" in error.message
    assert _count(gw.ledger) == 0


def test_without_a_valid_token_nothing_is_served(gw: Gw) -> None:
    for token in (None, "opl_mcp_not-a-token"):
        response = httpx2.post(
            gw.url,
            headers={"Accept": "application/json, text/event-stream"}
            | ({"Authorization": f"Bearer {token}"} if token else {}),
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        )
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
    assert _count(gw.ledger) == 0
