"""The MCP gateway's two files, read as a careful operator would hope: the clients file
(a token's sha256 per agent, its tenant and grant) and the proxy's upstream file. Anything
malformed is one typed error naming what is wrong; a token is kept as its hash only and
compared in full."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from opledger.adapters.mcp import McpToolAdapter, UpstreamInvalid, load_upstream
from opledger.adapters.registry import load_registry
from opledger.ledger import InvalidInput
from opledger.mcp.clients import (
    TOKEN_PREFIX,
    Caller,
    Clients,
    ClientsInvalid,
    add_client,
    digest,
    parse,
)
from opledger.settings import Settings

ENTRY = {"agent": "bot", "tenant": "acme", "grant": "auth_acme", "token_sha256": "a" * 64}


def test_a_token_is_kept_as_its_hash_and_names_its_caller(tmp_path: Path) -> None:
    path = tmp_path / "clients.json"
    token = add_client(path, Caller("bot", "acme", "auth_acme"))
    assert token.startswith(TOKEN_PREFIX) and len(token) > 40
    text = path.read_text()
    assert token not in text and digest(token) in text
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0  # not readable by others
    clients = Clients(path)
    assert clients.caller_for(token) == Caller("bot", "acme", "auth_acme")
    assert clients.caller_for(token[:-1]) is None and clients.caller_for("") is None
    assert Caller("bot", "acme", "auth_acme").workflow_id("run-1") == "mcp:bot:run-1"


def test_an_entry_removed_from_the_file_refuses_its_token_at_once(tmp_path: Path) -> None:
    path = tmp_path / "clients.json"
    token = add_client(path, Caller("bot", "acme", "auth_acme"))
    other = add_client(path, Caller("other", "globex", "auth_globex"))
    clients = Clients(path)
    assert clients.caller_for(token) is not None
    data = json.loads(path.read_text())
    path.write_text(json.dumps({"clients": [e for e in data["clients"] if e["agent"] != "bot"]}))
    assert clients.caller_for(token) is None
    assert clients.caller_for(other) == Caller("other", "globex", "auth_globex")


def test_one_agent_gets_one_token_and_a_bad_name_none(tmp_path: Path) -> None:
    path = tmp_path / "clients.json"
    add_client(path, Caller("bot", "acme", "auth_acme"))
    with pytest.raises(ClientsInvalid, match="already has a token"):
        add_client(path, Caller("bot", "globex", "auth_globex"))
    with pytest.raises(ClientsInvalid, match="cannot contain"):
        add_client(path, Caller("bot:two", "acme", "auth_acme"))
    assert len(json.loads(path.read_text())["clients"]) == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "is not JSON"),
        ("[]", 'needs a "clients" list'),
        (json.dumps({"clients": [1]}), "is not an object"),
        (json.dumps({"clients": [{"agent": "bot"}]}), "lacks tenant, grant, token_sha256"),
        (json.dumps({"clients": [{**ENTRY, "token_sha256": "xyz"}]}), "64 hex digits"),
        (json.dumps({"clients": [{**ENTRY, "tenant": ""}]}), "tenant"),
        (json.dumps({"clients": [{**ENTRY, "agent": "bot:x"}]}), "cannot contain ':'"),
        # its runs are mcp:<agent>:<run>, at most 200 characters: room is left for the run
        (json.dumps({"clients": [{**ENTRY, "agent": "b" * 129}]}), "the limit is 128"),
        (json.dumps({"clients": [ENTRY, ENTRY]}), "listed twice"),
        (json.dumps({"clients": [ENTRY, {**ENTRY, "agent": "b2"}]}), "share one token"),
    ],
)
def test_a_malformed_clients_file_is_one_typed_error(text: str, message: str) -> None:
    with pytest.raises(ClientsInvalid, match=message) as caught:
        parse(text)
    assert isinstance(caught.value, InvalidInput)


def test_a_missing_clients_file_stops_the_gateway_at_start(tmp_path: Path) -> None:
    with pytest.raises(ClientsInvalid, match="cannot read"):
        Clients(tmp_path / "nowhere.json")


GOOD_UPSTREAM = {
    "url": "http://127.0.0.1:9000/mcp",
    "effects": {"create_ticket": {"action": "tickets.create_ticket.v1", "target": "project"}},
    "passthrough": ["count_tickets"],
}


def test_an_upstream_file_names_its_effects_and_passthrough_tools(tmp_path: Path) -> None:
    path = tmp_path / "upstream.json"
    path.write_text(json.dumps(GOOD_UPSTREAM))
    upstream = load_upstream(path)
    assert upstream.tool_of("tickets.create_ticket.v1") == "create_ticket"
    assert upstream.passthrough == ("count_tickets",)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"url": "ftp://x"}, "url"),
        ({"effects": {"t": {"action": "not versioned"}}}, "action"),
        ({"effects": {"t": {"action": "a.b.v1", "intent_fields": [""]}}}, "intent_fields"),
        ({"effects": {"t": {"action": "a.b.v1", "surprise": 1}}}, "surprise"),
        ({"passthrough": ["create_ticket"]}, "both an effect and passed through"),
        (
            {"effects": {"a": {"action": "a.b.v1"}, "b": {"action": "a.b.v1"}}},
            "two tools share one action",
        ),
    ],
)
def test_a_malformed_upstream_file_is_one_typed_error(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    path = tmp_path / "upstream.json"
    path.write_text(json.dumps({**GOOD_UPSTREAM, **change}))
    with pytest.raises(UpstreamInvalid, match=message):
        load_upstream(path)


#: the upstream's adapter module run with the MCP SDK made unimportable (no `[mcp]` extra)
WITHOUT_SDK = """
import importlib.abc, sys
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mcp", "mcp_types"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Missing())
from opledger.adapters.mcp import McpToolAdapter, load_upstream
upstream = load_upstream(sys.argv[1])
try:
    McpToolAdapter(upstream)
except ModuleNotFoundError as exc:
    print("refused:", exc.name)
"""


def test_the_upstream_file_reads_without_the_mcp_extra_and_its_adapter_refuses_to_start(
    tmp_path: Path,
) -> None:
    path = tmp_path / "upstream.json"
    path.write_text(json.dumps(GOOD_UPSTREAM))
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_SDK, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "refused: mcp"


@pytest.mark.parametrize("factory", ["opledger.adapters.mcp", "opledger.mcp.upstream"])
def test_the_upstreams_registry_serves_its_effects_under_both_names(
    tmp_path: Path, factory: str
) -> None:
    """`opledger.mcp.upstream:build_registry` is the name 0.1.0 documented; it still works."""
    path = tmp_path / "upstream.json"
    path.write_text(json.dumps(GOOD_UPSTREAM))
    settings = Settings(adapters=f"{factory}:build_registry", mcp_upstream=str(path))
    registry = load_registry(settings)
    adapter = registry.adapter_for("tickets.create_ticket.v1")
    assert isinstance(adapter, McpToolAdapter)
    assert adapter.contract.idempotency.kind == "none"
    assert adapter.contract.lookup.kind == "none"


def test_check_refuses_actions_the_gateway_could_not_name_apart(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from opledger.cli.checks import _mcp_clients

    path = tmp_path / "clients.json"
    path.write_text(json.dumps({"clients": [ENTRY]}))
    apart = _mcp_clients(str(path), SimpleNamespace(actions=("crm.close_case.v1",)))
    assert apart.ok, apart.detail
    clash = _mcp_clients(str(path), SimpleNamespace(actions=("crm.a_b.v1", "crm_a.b.v1")))
    assert not clash.ok and "both be the MCP tool" in clash.detail
