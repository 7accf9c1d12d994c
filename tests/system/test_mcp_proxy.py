"""`opledger mcp proxy` in front of an MCP server this project did not write (an MCP SDK
server with one effectful and one read-only tool), with real workers calling it: the
effectful tool's answer is lost → unknown → a review, after exactly one upstream call; an
upstream down for longer than five attempts is waited out and called once; the
read-only tool is passed through; asked again, a confirmed call is answered, not repeated."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import RequestParamsMeta

from opledger.dev.processes import Proc, Stack, free_port, listening, wait_until
from opledger.ledger import Ledger, Status
from opledger.mcp.clients import Caller, add_client
from opledger.mcp.tools import RUN_META
from tests.conftest import truncate_all
from tests.forks import ForkedProc
from tests.system.conftest import worker_with

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

UPSTREAM = Path(__file__).with_name("upstream_mcp.py")
ACTION = "tickets.create_ticket.v1"


@dataclass
class Upstream:
    """The upstream MCP server's process, which a test may stop (its port then refuses
    connections) and start again on the same port."""

    port: int
    state: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [str(UPSTREAM), "--port", str(self.port), "--state", str(self.state)]
        self.proc = subprocess.Popen([sys.executable, *argv])
        wait_until(lambda: listening(self.port), 30, "the upstream MCP server")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Rig:
    url: str
    token: str
    state: Path
    worker: Proc  #: the stack's `w1` while the proxy runs: it serves the upstream's tools
    upstream: Upstream

    def upstream_calls(self) -> int:
        return len(json.loads(self.state.read_text())) if self.state.exists() else 0

    @property
    def slow(self) -> Path:
        """While this file exists, the upstream answers after the workers gave up."""
        return self.state.parent / "slow"


@pytest.fixture(scope="module")
def proxy(
    stack: Stack, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rig]:
    """The upstream MCP server, a worker serving its effectful tool and the proxy in front
    of it: started once for this file's tests (`rig` gives each test a fresh upstream)."""
    tmp_path = tmp_path_factory.mktemp("mcp-proxy")
    state = tmp_path / "tickets.json"
    up_port, port = free_port(), free_port()
    upstream = Upstream(up_port, state)
    upstream.start()
    config = tmp_path / "upstream.json"
    config.write_text(
        json.dumps(
            {
                "url": f"http://127.0.0.1:{up_port}/mcp",
                "provider": "tickets",
                "timeout_seconds": 1.5,
                "effects": {
                    "create_ticket": {
                        "action": ACTION,
                        "target": "project",
                        "intent_fields": ["title"],
                        "effect": "ticket",
                    }
                },
                "passthrough": ["count_tickets"],
            }
        )
    )
    clients = tmp_path / "clients.json"
    token = add_client(clients, Caller("bot", "acme", "auth_acme"))
    env = {
        "OPLEDGER_ADAPTERS": "opledger.adapters.mcp:build_registry",
        "OPLEDGER_MCP_UPSTREAM": str(config),
        "OPLEDGER_MCP_CLIENTS": str(clients),
        # the breaker probes an upstream that refuses connections every second
        "OPLEDGER_PROVIDER_LIMITS": json.dumps(
            {"tickets": {"probe_every_seconds": 0.5, "probe_max_seconds": 1}}
        ),
    }
    for name in [n for n in stack.workers if n != "w1"]:  # only this file's worker may
        stack.kill_worker(name)  # take the tickets action's messages
    proxy: Proc | None = None
    try:
        with worker_with(stack, "w1", 2, **env) as worker:
            argv = ["mcp", "proxy", "--port", str(port), "--wait", "10"]
            proxy = ForkedProc("mcp-proxy", argv, {**stack.env, **env}, tmp_path / "proxy.log")
            wait_until(lambda: listening(port) or proxy.proc.poll() is not None, 60, "proxy")
            assert proxy.proc.poll() is None, proxy.output()
            try:
                yield Rig(f"http://127.0.0.1:{port}/mcp", token, state, worker, upstream)
            finally:
                # the plain worker put back next serves no tickets action: an open
                # operation of one would stop it from starting (its startup check)
                truncate_all(database_url)
    finally:
        if proxy is not None and proxy.proc.poll() is None:
            proxy.kill()
        upstream.stop()


@pytest.fixture
def rig(proxy: Rig, running: Stack, sys_ledger: Ledger) -> Iterator[Rig]:
    """The proxy, its worker `w1` and the stack's beat running; an empty ledger with the
    caller's grant; an upstream with no tickets yet, answering at once."""
    assert running.workers["w1"] is proxy.worker, "the upstream's worker is gone"
    if not proxy.upstream.running:  # a test stopped it and failed before starting it again
        proxy.upstream.start()
    proxy.state.unlink(missing_ok=True)
    proxy.slow.unlink(missing_ok=True)
    try:
        yield proxy
    finally:
        proxy.slow.unlink(missing_ok=True)


def call(rig: Rig, tool: str, args: dict[str, Any], run: str = "run-1") -> Any:
    async def go() -> Any:
        headers = {"Authorization": f"Bearer {rig.token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(rig.url, http_client=http)) as client,
        ):
            return await client.call_tool(tool, args, meta=cast(RequestParamsMeta, {RUN_META: run}))

    return anyio.run(go)


def test_the_proxy_offers_the_named_tools_only_under_their_own_names(rig: Rig) -> None:
    async def go() -> Any:
        headers = {"Authorization": f"Bearer {rig.token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(rig.url, http_client=http)) as client,
        ):
            return await client.list_tools()

    tools = {t.name: t for t in anyio.run(go).tools}
    assert set(tools) == {"create_ticket", "count_tickets", "opledger_status"}
    assert set(tools["create_ticket"].input_schema["properties"]) >= {"project", "title"}


def test_a_lost_answer_of_the_upstream_is_unknown_and_goes_to_a_person_after_one_call(
    rig: Rig, sys_ledger: Ledger
) -> None:
    rig.slow.touch()  # the upstream answers after the workers gave up
    answer = call(rig, "create_ticket", {"project": "ops", "title": "Printer on fire"})
    assert not answer.is_error, answer
    op_id = answer.structured_content["op_id"]

    def reviewed() -> bool:
        history = sys_ledger.history(op_id)
        return history.operation.status is Status.UNKNOWN and history.open_review is not None

    wait_until(reviewed, 60, "the lost call to reach review")
    assert rig.upstream_calls() == 1  # never called again blindly
    counted = call(rig, "count_tickets", {"project": "ops"})  # read-only: passed through
    assert not counted.is_error and counted.structured_content == {"count": 1}
    again = call(rig, "create_ticket", {"project": "ops", "title": "Printer on fire"})
    assert again.structured_content["op_id"] == op_id
    assert again.structured_content["kind"] == "unknown"
    assert "review_id" in again.structured_content
    assert rig.upstream_calls() == 1


def test_a_confirmed_call_asked_again_is_answered_and_not_repeated(rig: Rig) -> None:
    first = call(rig, "create_ticket", {"project": "web", "title": "Logo is blurry"})
    assert first.structured_content["kind"] == "confirmed", first.structured_content
    assert first.structured_content["data"] == {"ticket": "T-1", "project": "web"}
    again = call(rig, "create_ticket", {"project": "web", "title": "Logo is blurry"})
    assert again.structured_content["asked_before"] is True
    assert again.structured_content["op_id"] == first.structured_content["op_id"]
    other = call(rig, "create_ticket", {"project": "web", "title": "Footer overlaps"})
    assert other.structured_content["op_id"] != first.structured_content["op_id"]
    assert rig.upstream_calls() == 2


def test_an_upstream_down_for_more_than_five_attempts_is_waited_out_and_called_once(
    rig: Rig, sys_ledger: Ledger
) -> None:
    """Attempts that never reached the upstream (its port refuses connections) are its
    outage, not the operation's: its breaker paces them, none counts toward the five an
    operation may use, nobody is asked, and the call goes through once it is back."""
    rig.upstream.stop()
    answer = call(rig, "create_ticket", {"project": "ops", "title": "Upstream was down"})
    assert not answer.is_error, answer
    op_id = answer.structured_content["op_id"]
    assert answer.structured_content["kind"] in ("pending", "unknown"), answer.structured_content

    def refused_or_reviewed() -> bool:
        history = sys_ledger.history(op_id)
        return len(history.attempts) > 6 or bool(history.reviews)

    wait_until(refused_or_reviewed, 90, "more than five attempts refused at the door")
    history = sys_ledger.history(op_id)
    assert not history.reviews, [r.reason for r in history.reviews]
    assert history.operation.status not in (Status.CONFIRMED, Status.REJECTED)
    assert all(
        a.response and a.response["detail"]["why"] == "no_connection" for a in history.attempts[:-1]
    )
    rig.upstream.start()
    wait_until(
        lambda: sys_ledger.get(op_id).status is Status.CONFIRMED, 60, "the call once it is back"
    )
    assert rig.upstream_calls() == 1
    assert not sys_ledger.history(op_id).reviews
