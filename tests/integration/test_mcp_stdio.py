"""`opledger mcp serve --transport stdio`, launched as an MCP host launches a server (the
SDK's stdio client): it serves the one caller its OPLEDGER_MCP_TOKEN names, and refuses to
start without one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp_types import RequestParamsMeta

from opledger.ledger import Ledger
from opledger.mcp.clients import TOKEN, Caller, add_client
from opledger.mcp.tools import RUN_META
from tests.clirun import Run

pytestmark = pytest.mark.timeout(120)

#: a broker URL no test connects to (the start stops before it would)
BROKER = "redis://127.0.0.1:1/0"
SERVE = ["-m", "opledger.cli", "mcp", "serve", "--transport", "stdio", "--wait", "0"]


def _env(database_url: str, redis_server: str, clients: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "OPLEDGER_DATABASE_URL": database_url,
        "OPLEDGER_BROKER_URL": f"{redis_server}/14",  # no worker reads it here
        "OPLEDGER_MCP_CLIENTS": str(clients),
        **extra,
    }


def test_stdio_serves_the_caller_its_token_names(
    ledger: Ledger, grant: str, database_url: str, redis_server: str, tmp_path: Path
) -> None:
    clients = tmp_path / "clients.json"
    token = add_client(clients, Caller("bot", "acme", grant))
    env = _env(database_url, redis_server, clients, OPLEDGER_MCP_TOKEN=token)

    async def go() -> tuple[Any, Any]:
        params = StdioServerParameters(command=sys.executable, args=SERVE, env=env)
        async with Client(params) as client:
            tools = await client.list_tools()
            meta = cast(RequestParamsMeta, {RUN_META: "run-1"})
            args = {"target": "case-318", "payload": {"note": "done"}}
            return tools, await client.call_tool("crm_close_case_v1", args, meta=meta)

    tools, result = anyio.run(go)
    assert "crm_close_case_v1" in {t.name for t in tools.tools}
    assert not result.is_error and result.structured_content["kind"] == "pending"
    op = ledger.get(result.structured_content["op_id"])
    assert (op.tenant, op.workflow_id) == ("acme", "mcp:bot:run-1")


def test_stdio_refuses_to_start_without_a_clients_token(
    ledger: Ledger, database_url: str, redis_server: str, tmp_path: Path
) -> None:
    clients = tmp_path / "clients.json"
    add_client(clients, Caller("bot", "acme", "auth_acme"))
    for token in ("", "opl_mcp_not-the-token"):
        env = _env(database_url, redis_server, clients, OPLEDGER_MCP_TOKEN=token)
        done = subprocess.run(
            [sys.executable, *SERVE], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 4, done.stderr
        assert "set OPLEDGER_MCP_TOKEN to a client's token" in done.stderr
        assert not token or token not in done.stderr  # a token is never echoed


def test_a_host_that_cannot_set_meta_gets_one_act_across_launches_of_stdio(
    ledger: Ledger, grant: str, database_url: str, redis_server: str, tmp_path: Path
) -> None:
    """A desktop host names no run: its client's run mode is `token`. The host launched
    again (a new server process, a new request id) asks for the same act: the same
    operation, nothing new."""
    clients = tmp_path / "clients.json"
    token = add_client(clients, Caller("desk", "acme", grant, run_mode=TOKEN))
    env = _env(database_url, redis_server, clients, OPLEDGER_MCP_TOKEN=token)
    args = {"target": "case-5", "payload": {"fields": {"priority": "high"}}}

    async def launch() -> Any:
        params = StdioServerParameters(command=sys.executable, args=SERVE, env=env)
        async with Client(params) as client:
            return await client.call_tool("crm_update_case_v1", args)  # no _meta at all

    first, again = anyio.run(launch), anyio.run(launch)
    assert not first.is_error, first.structured_content
    assert again.structured_content["op_id"] == first.structured_content["op_id"]
    assert again.structured_content["asked_before"] is True
    assert [op.workflow_id for op in ledger.list(limit=10)] == ["mcp:desk"]


@pytest.mark.parametrize("unset", ["OPLEDGER_DATABASE_URL", "OPLEDGER_BROKER_URL"])
def test_stdio_launched_without_a_variable_it_needs_exits_naming_it(
    ledger: Ledger, database_url: str, redis_server: str, tmp_path: Path, unset: str
) -> None:
    """What a host that passes the server too little environment sees: an exit before any
    answer, and the variable named on stderr (which hosts show in their logs)."""
    clients = tmp_path / "clients.json"
    token = add_client(clients, Caller("bot", "acme", "auth_acme"))
    env = _env(database_url, redis_server, clients, OPLEDGER_MCP_TOKEN=token)
    del env[unset]
    done = subprocess.run(
        [sys.executable, *SERVE],
        env=env,
        stdin=subprocess.DEVNULL,  # a server that started would read EOF and end
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 4, done.stderr
    assert f"{unset} is not set" in done.stderr


@pytest.mark.parametrize("command", ["serve", "proxy"])
def test_a_wait_longer_than_hosts_wait_for_an_answer_is_warned_about_at_start(
    invoke: Callable[..., Run], tmp_path: Path, command: str
) -> None:
    """A call's answer is held open for `--wait`: over 45 s, the hosts' and proxies' 60 s is
    near, and the start says so (the command goes on: here it stops at the clients file)."""
    env = {"OPLEDGER_MCP_CLIENTS": str(tmp_path / "nowhere.json"), "OPLEDGER_BROKER_URL": BROKER}
    long = invoke("mcp", command, "--wait", "50", **env)
    assert "warning: --wait 50 is more than 45 s" in long.err
    assert "Keep --wait under 45 s" in long.err
    assert long.code != 0 and "clients file" in long.err  # it went on to read it
    short = invoke("mcp", command, "--wait", "45", **env)
    assert "warning" not in short.err and "clients file" in short.err
    for bad in ("-1", "nan", "inf"):
        refused = invoke("mcp", command, "--wait", bad, **env)
        assert refused.code == 2 and "--wait is a number of seconds" in refused.err
