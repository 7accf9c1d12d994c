"""A host that cannot set a call's `_meta` (a desktop host configured by a JSON file):
its client's run mode in the clients file says where the run comes from instead — `token`
(every call of the client in one run of its own) or `argument` (a required `run`
argument) — and `_meta`, whenever a call has it, wins. Over real streamable HTTP on the
real ledger, like tests/integration/test_mcp_gateway.py; no worker runs here.

Also here: the gateway answers each HTTP request with one JSON body (a host sees a dead
gateway as a failed request, not a stream it may wait to resume), and `serve` leaves an
MCP upstream's tools to the proxy, which knows their schemas.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest

from opledger.adapters.crm import CrmAdapter
from opledger.adapters.mcp import McpToolAdapter, Upstream, UpstreamInvalid
from opledger.adapters.registry import Registry
from opledger.agents.effects import Effects
from opledger.ledger import Ledger
from opledger.mcp.clients import (
    ARGUMENT,
    META,
    TOKEN,
    Caller,
    Clients,
    ClientsInvalid,
    add_client,
    parse,
)
from opledger.mcp.proxy import Proxy
from opledger.mcp.server import Gateway, identify_by_token
from opledger.mcp.tools import RUN_ARGUMENT, STATUS_TOOL
from tests.clirun import Run
from tests.integration.test_mcp_gateway import Gw, call, client, serving

pytestmark = pytest.mark.timeout(120)

UPDATE = "crm_update_case_v1"  # an act of the run (a close is the tenant's: one act for all)
ACT = {"target": "case-9", "payload": {"fields": {"priority": "high"}}}


@pytest.fixture
def gw(ledger: Ledger, grant: str, tmp_path: Path) -> Iterator[Gw]:
    registry = Registry([CrmAdapter("http://127.0.0.1:9", account="acme")])
    path = tmp_path / "clients.json"
    tokens = {
        "bot": add_client(path, Caller("bot", "acme", grant)),
        "desk": add_client(path, Caller("desk", "acme", grant, run_mode=TOKEN)),
        "chat": add_client(path, Caller("chat", "acme", grant, run_mode=ARGUMENT)),
    }
    published: list[str] = []
    effects = Effects(Ledger(ledger.engine, actions=registry), publish=published.append)
    gateway = Gateway(effects, registry, identify_by_token, wait=0.2)
    with serving(gateway, Clients(path)) as url:
        yield Gw(url, tokens, published, ledger)


def _ops(gw: Gw) -> list[Any]:
    return list(gw.ledger.list(limit=1000))


def _tools(gw: Gw, token: str) -> dict[str, Any]:
    async def go() -> Any:
        async with client(gw, gw.tokens[token]) as c:
            return await c.list_tools()

    return {t.name: t for t in anyio.run(go).tools}


def _line(**entry: Any) -> str:
    base = {"agent": "desk", "tenant": "acme", "grant": "auth_acme", "token_sha256": "a" * 64}
    return json.dumps({"clients": [base | entry]})


@pytest.mark.parametrize("mode", ["daily", 5, "", None, "TOKEN"])
def test_a_run_mode_the_gateway_does_not_know_is_refused_by_name(mode: Any) -> None:
    with pytest.raises(ClientsInvalid, match="run must be one of meta, token, argument"):
        parse(_line(run=mode))


def test_an_entry_without_a_run_mode_is_meta_and_a_token_is_made_with_its_mode(
    tmp_path: Path, invoke: Callable[..., Run]
) -> None:
    assert next(iter(parse(_line()).values())).run_mode == META
    path = tmp_path / "clients.json"
    grant = ["--tenant", "acme", "--grant", "auth_acme", "--file", str(path)]
    made = invoke("mcp", "token", "--agent", "desk", *grant, "--run", "token")
    assert made.code == 0, made.err
    assert json.loads(path.read_text())["clients"][0]["run"] == "token"
    assert Clients(path).caller_for(made.out.strip()) == Caller(
        "desk", "acme", "auth_acme", run_mode=TOKEN
    )
    plain = invoke("mcp", "token", "--agent", "bot", *grant)
    assert plain.code == 0  # meta: the entry is as it was before run modes
    assert "run" not in json.loads(path.read_text())["clients"][1]
    daily = invoke("mcp", "token", "--agent", "cron", *grant, "--run", "daily")
    assert daily.code == 2 and "--run is one of meta, token, argument" in daily.err
    assert len(json.loads(path.read_text())["clients"]) == 2


def test_a_token_client_acts_in_its_own_run_on_every_connection(gw: Gw) -> None:
    first = call(gw, UPDATE, ACT, run=None, token="desk")
    assert not first.is_error, first.structured_content
    op = gw.ledger.get(first.structured_content["op_id"])
    assert op.workflow_id == "mcp:desk"  # the agent's run: no named run can be it
    # the host lost the answer and asks again on a new connection: the same operation
    again = call(gw, UPDATE, ACT, run=None, token="desk")
    assert again.structured_content["op_id"] == op.id
    assert again.structured_content["asked_before"] is True
    # its own run's operations are its own to follow
    assert not call(gw, STATUS_TOOL, {"op_id": op.id}, run=None, token="desk").is_error
    assert call(gw, STATUS_TOOL, {"op_id": op.id}, token="bot").is_error
    # a meta client that sends no run is still refused (its mode is meta)
    refused = call(gw, UPDATE, ACT, run=None, token="bot")
    assert refused.structured_content["error"] == "MissingRun"
    assert len(_ops(gw)) == 1


def test_a_call_whose_meta_names_a_run_is_in_that_run_whatever_the_clients_mode(gw: Gw) -> None:
    named = call(gw, UPDATE, ACT, run="job-7", token="desk").structured_content
    assert gw.ledger.get(named["op_id"]).workflow_id == "mcp:desk:job-7"
    own = call(gw, UPDATE, ACT, run=None, token="desk").structured_content
    assert own["op_id"] != named["op_id"]
    both = {**ACT, RUN_ARGUMENT: "from-the-model"}
    chat = call(gw, UPDATE, both, run="job-7", token="chat").structured_content
    assert gw.ledger.get(chat["op_id"]).workflow_id == "mcp:chat:job-7"
    # present but empty is no run: refused, never a fall back to another run
    empty = call(gw, UPDATE, ACT, run="", token="desk")
    assert empty.is_error and empty.structured_content["error"] == "InvalidRun"
    assert len(_ops(gw)) == 3


@pytest.mark.parametrize("run", [42, "", "   ", True, {"id": "job-7"}])
def test_a_meta_run_that_is_not_a_non_blank_string_is_refused_saying_what_it_must_be(
    gw: Gw, run: Any
) -> None:
    refused = call(gw, UPDATE, ACT, run=run, token="desk")  # a token client: no fall back
    assert refused.is_error
    answer = refused.structured_content
    assert answer["error"] == "InvalidRun", answer
    assert "_meta['opledger/run'] must be a non-blank string" in answer["message"]
    assert _ops(gw) == [] and gw.published == []


def test_each_caller_is_shown_how_long_a_run_may_be_and_a_longer_one_is_refused_so(
    gw: Gw,
) -> None:
    """The run is kept as `mcp:<agent>:<run>`, at most 200 characters: the `run` argument's
    maxLength is what the caller's prefix leaves, and a longer run (argument or `_meta`) is
    refused in words that say how long it may be."""
    fits = 200 - len("mcp:chat:")
    assert Caller("chat", "acme", "g", run_mode=ARGUMENT).max_run_length == fits
    shown = _tools(gw, "chat")[UPDATE].input_schema["properties"][RUN_ARGUMENT]
    assert shown["maxLength"] == fits
    longest = call(gw, UPDATE, {**ACT, RUN_ARGUMENT: "r" * fits}, run=None, token="chat")
    assert not longest.is_error, longest.structured_content
    assert len(gw.ledger.get(longest.structured_content["op_id"]).workflow_id) == 200
    longer = call(gw, UPDATE, {**ACT, RUN_ARGUMENT: "r" * (fits + 1)}, run=None, token="chat")
    answer = longer.structured_content
    assert answer["error"] == "InvalidArguments", answer
    assert f"the 'run' argument is {fits + 1} characters; at most {fits} fit" in answer["message"]
    mine = 200 - len("mcp:bot:")
    assert not call(gw, UPDATE, ACT, run="r" * mine, token="bot").is_error
    for run in ("r" * (mine + 1), "\u0958" * 100):  # U+0958 is two characters in NFC
        meta = call(gw, UPDATE, ACT, run=run, token="bot").structured_content
        assert meta["error"] == "InvalidRun", meta
        assert f"characters; at most {mine} fit" in meta["message"]
    assert len(_ops(gw)) == 2


def test_an_argument_client_is_offered_a_required_run_argument_and_refused_without_one(
    gw: Gw,
) -> None:
    theirs = _tools(gw, "chat")
    schema = theirs[UPDATE].input_schema
    assert schema["required"] == ["target", "payload", RUN_ARGUMENT]
    assert schema["properties"][RUN_ARGUMENT]["type"] == "string"
    assert RUN_ARGUMENT not in theirs[STATUS_TOOL].input_schema["properties"]
    assert RUN_ARGUMENT not in _tools(gw, "bot")[UPDATE].input_schema["properties"]
    missing = call(gw, UPDATE, ACT, run=None, token="chat")
    assert missing.is_error and missing.structured_content["error"] == "MissingRun"
    assert f"set the {RUN_ARGUMENT!r} argument" in missing.structured_content["message"]
    wrong = call(gw, UPDATE, {**ACT, RUN_ARGUMENT: 7}, run=None, token="chat")
    assert wrong.structured_content["error"] == "InvalidArguments"
    assert _ops(gw) == [] and gw.published == []
    made = call(gw, UPDATE, {**ACT, RUN_ARGUMENT: "conv-1"}, run=None, token="chat")
    op = gw.ledger.get(made.structured_content["op_id"])
    assert op.workflow_id == "mcp:chat:conv-1"
    assert gw.ledger.payload(op.id) == ACT["payload"]  # the run is no part of the act
    again = call(gw, UPDATE, {**ACT, RUN_ARGUMENT: "conv-1"}, run=None, token="chat")
    assert again.structured_content["op_id"] == op.id
    # a client of another mode has no run argument: it does not fit its schema
    extra = call(gw, UPDATE, {**ACT, RUN_ARGUMENT: "conv-1"}, token="bot")
    assert extra.structured_content["error"] == "InvalidArguments"


def test_each_http_request_is_answered_with_one_json_body(gw: Gw) -> None:
    headers = {
        "Authorization": f"Bearer {gw.tokens['desk']}",
        "Accept": "application/json, text/event-stream",  # what every client accepts
    }
    body = {"jsonrpc": "2.0", "id": 3, "method": "tools/call"}
    body["params"] = {"name": UPDATE, "arguments": ACT}
    response = httpx2.post(gw.url, headers=headers, json=body, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    result = response.json()["result"]
    assert result["structuredContent"]["kind"] == "pending"


def test_serve_leaves_an_mcp_upstreams_tools_to_the_proxy(ledger: Ledger) -> None:
    upstream = Upstream.model_validate(
        {
            "url": "http://127.0.0.1:9/mcp",
            "provider": "tickets",
            "effects": {"create_ticket": {"action": "tickets.create_ticket.v1"}},
        }
    )
    registry = Registry(
        [CrmAdapter("http://127.0.0.1:9", account="acme"), McpToolAdapter(upstream)]
    )
    assert "tickets.create_ticket.v1" in registry.actions

    def refuse() -> Caller:
        raise AssertionError("no call here")

    gateway = Gateway(Effects(Ledger(ledger.engine, actions=registry)), registry, refuse, wait=0)
    names = {t.name for t in gateway.tools}
    assert names == {"crm_close_case_v1", "crm_update_case_v1", STATUS_TOOL}


def test_the_proxy_gives_an_argument_client_a_run_argument_on_its_effects_only(
    ledger: Ledger,
) -> None:
    """An upstream tool with a `run` argument of its own is not offered to an `argument`
    client (which would be the run?); a passthrough tool is offered as it is."""
    upstream = Upstream.model_validate(
        {
            "url": "http://127.0.0.1:9/mcp",
            "provider": "tickets",
            "effects": {
                "create_ticket": {"action": "tickets.create_ticket.v1", "target": "project"},
                "start_run": {"action": "tickets.start_run.v1", "target": "pipeline"},
            },
            "passthrough": ["count_tickets"],
        }
    )
    registry = Registry([McpToolAdapter(upstream)])

    def tool(name: str, *args: str) -> types.Tool:
        props = {a: {"type": "string"} for a in args}
        return types.Tool(name=name, input_schema={"type": "object", "properties": props})

    tools = [
        tool("create_ticket", "project", "title"),
        tool("start_run", "pipeline", RUN_ARGUMENT),
        tool("count_tickets", "project"),
    ]
    effects = Effects(Ledger(ledger.engine, actions=registry))
    proxy = Proxy(effects, registry, identify_by_token, wait=0, upstream=upstream, tools=tools)
    chat = {t.name: t for t in proxy.tools_for(Caller("chat", "acme", "g", run_mode=ARGUMENT))}
    assert set(chat) == {"create_ticket", "count_tickets", STATUS_TOOL}
    assert RUN_ARGUMENT in chat["create_ticket"].input_schema["required"]
    assert RUN_ARGUMENT not in chat["count_tickets"].input_schema["properties"]
    bot = {t.name: t for t in proxy.tools_for(Caller("bot", "acme", "g"))}
    assert set(bot) == {"create_ticket", "start_run", "count_tickets", STATUS_TOOL}
    assert RUN_ARGUMENT not in bot["create_ticket"].input_schema["properties"]


def _proxy(ledger: Ledger, effect: str, passthrough: str) -> Proxy:
    upstream = Upstream.model_validate(
        {
            "url": "http://127.0.0.1:9/mcp",
            "effects": {effect: {"action": "tickets.create_ticket.v1"}},
            "passthrough": [passthrough],
        }
    )
    registry = Registry([McpToolAdapter(upstream)])
    tools = [types.Tool(name=n, input_schema={"type": "object"}) for n in (effect, passthrough)]
    effects = Effects(Ledger(ledger.engine, actions=registry))
    return Proxy(effects, registry, identify_by_token, wait=0, upstream=upstream, tools=tools)


def test_the_proxy_keeps_the_upstreams_names_and_warns_of_one_a_model_api_refuses(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    """The upstream's tools are its own, known by their names to its hosts and to the
    upstream file: kept, even one a model API would refuse as a function name (a warning
    at start says so)."""
    with caplog.at_level(logging.WARNING, logger="opledger.mcp.proxy"):
        proxy = _proxy(ledger, "tickets.create", "count_tickets")
    assert {t.name for t in proxy.tools} == {"tickets.create", "count_tickets", STATUS_TOOL}
    assert [r.args for r in caplog.records] == [("tickets.create",)]


@pytest.mark.parametrize("name", [STATUS_TOOL, "opledger.status"])
def test_the_proxy_refuses_an_upstream_tool_named_as_its_status_tool(
    ledger: Ledger, name: str
) -> None:
    with pytest.raises(UpstreamInvalid, match="the name of the proxy's status tool"):
        _proxy(ledger, "create_ticket", name)
