"""The MCP gateway as users run it: `opledger mcp serve` in a process of its own, the MCP
SDK's client over streamable HTTP, real workers and the sandbox CRM — counted at the
provider. A call whose answer is lost is re-issued under a new request id, a gateway is
SIGKILLed mid-call and the call re-issued to a new one, two clients ask for one act at
once: each act is applied once, and the re-issued call is answered with the operation the
first one recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import RequestParamsMeta

from opledger.dev.processes import Proc, Stack, free_port, listening, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger
from opledger.mcp.clients import Caller, add_client
from opledger.mcp.tools import RUN_META
from tests.forks import ForkedProc

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

#: an update, not a close: a second close would be refused by the CRM (the case is closed),
#: a second update is applied, so a duplicate would show in the count
UPDATE = "crm_update_case_v1"


@dataclass
class Gateway:
    stack: Stack
    clients: Path
    token: str
    port: int = field(default_factory=free_port)
    proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        env = {**self.stack.env, "OPLEDGER_MCP_CLIENTS": str(self.clients)}
        log = self.stack.workdir / f"{self.stack.name}-mcp.log"
        argv = ["mcp", "serve", "--port", str(self.port), "--wait", "15"]
        self.proc = proc = ForkedProc("mcp", argv, env, log)
        wait_until(lambda: listening(self.port) or proc.proc.poll() is not None, 60, "mcp")
        assert proc.proc.poll() is None, proc.output()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # SIGKILL, the whole process group


@pytest.fixture(scope="module")
def module_gateway(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway process for this file's tests (a test that kills it starts another)."""
    clients = tmp_path_factory.mktemp("mcp") / "clients.json"
    token = add_client(clients, Caller("bot", "acme", "auth_acme"))
    gw = Gateway(stack, clients, token)
    gw.start()
    try:
        yield gw
    finally:
        if gw.proc is not None and gw.proc.proc.poll() is None:
            gw.kill()


@pytest.fixture
def gateway(module_gateway: Gateway, running: Stack, sys_ledger: Ledger) -> Gateway:
    """The gateway running (started again if a test left it killed), the stack's worker
    and beat running, an empty ledger with the caller's grant."""
    assert module_gateway.proc is not None
    if module_gateway.proc.proc.poll() is not None:
        module_gateway.start()
    return module_gateway


@asynccontextmanager
async def _client(gw: Gateway, timeout: float) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {gw.token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        Client(streamable_http_client(gw.url, http_client=http)) as c,
    ):
        yield c


async def _call(gw: Gateway, run: str, case: str, *, timeout: float = 60) -> dict[str, Any]:
    async with _client(gw, timeout) as c:
        meta = cast(RequestParamsMeta, {RUN_META: run})
        payload = {"fields": {"status": "resolved"}, "note": f"the agent ({run})"}
        result = await c.call_tool(UPDATE, {"target": case, "payload": payload}, meta=meta)
    assert not result.is_error, result
    return cast(dict[str, Any], result.structured_content)


def call(gw: Gateway, run: str, case: str, *, timeout: float = 60) -> dict[str, Any]:
    return anyio.run(lambda: _call(gw, run, case, timeout=timeout))


def lost(gw: Gateway, run: str, case: str, timeout: float) -> None:
    """A call whose answer never arrives: the client gives up after `timeout` seconds."""
    with pytest.raises(BaseException):  # noqa: B017 (the SDK's transport error, grouped)
        call(gw, run, case, timeout=timeout)


def updates(sandbox: Sandbox, case: str) -> int:
    """How many updates of `case` the CRM applied."""
    return sum(n for act, n in sandbox.by_act().items() if act.endswith(f":update:{case}"))


def test_a_call_whose_answer_was_lost_is_reissued_and_the_case_is_updated_once(
    gateway: Gateway, sandbox: Sandbox, sys_ledger: Ledger
) -> None:
    sandbox.fault("crm", "delay_after_commit", delay_s=4)  # applied, answered 4 s later
    # the client gives up before the worker's own 1 s timeout (the stack's provider timeout):
    # the operation cannot have settled by then, however soon a lookup confirms it after
    lost(gateway, "run-lost", "case-mcp-1", timeout=0.9)
    again = call(gateway, "run-lost", "case-mcp-1")  # a new connection, a new request id
    assert again["asked_before"] is True and again["kind"] == "confirmed", again
    assert updates(sandbox, "case-mcp-1") == 1
    ops = [op for op in sys_ledger.list(limit=100) if op.workflow_id == "mcp:bot:run-lost"]
    assert [op.id for op in ops] == [again["op_id"]]


def test_a_gateway_killed_mid_call_is_restarted_and_the_reissued_call_updates_the_case_once(
    gateway: Gateway, sandbox: Sandbox, sys_ledger: Ledger
) -> None:
    sandbox.fault("crm", "delay_after_commit", delay_s=4)
    caught: list[BaseException] = []

    def first() -> None:
        try:
            call(gateway, "run-kill", "case-mcp-2", timeout=60)
        except BaseException as exc:  # the gateway dies under it
            caught.append(exc)

    thread = threading.Thread(target=first)
    thread.start()

    def recorded() -> str | None:
        ops = sys_ledger.list(limit=100)
        return next((op.id for op in ops if op.workflow_id == "mcp:bot:run-kill"), None)

    op_id = wait_until(recorded, 30, "the gateway to record the call")
    gateway.kill()
    thread.join(30)
    assert caught, "the first call should have lost its gateway"
    gateway.start()  # a new gateway process, same port
    again = call(gateway, "run-kill", "case-mcp-2")
    assert again["op_id"] == op_id and again["asked_before"] is True
    assert again["kind"] == "confirmed", again
    assert updates(sandbox, "case-mcp-2") == 1


def test_two_clients_asking_for_one_act_at_once_update_the_case_once(
    gateway: Gateway, sandbox: Sandbox
) -> None:
    answers: list[dict[str, Any]] = []

    async def both() -> None:
        async def one() -> None:
            answers.append(await _call(gateway, "run-race", "case-mcp-3"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)

    anyio.run(both)
    assert len({a["op_id"] for a in answers}) == 1
    assert sorted(a["asked_before"] for a in answers) == [False, True]
    assert {a["kind"] for a in answers} == {"confirmed"}
    assert updates(sandbox, "case-mcp-3") == 1


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcp_onboarding.py"


def test_the_example_agent_closes_and_emails_once_however_often_it_runs(
    gateway: Gateway, sandbox: Sandbox
) -> None:
    env = {**os.environ, "OPLEDGER_MCP_TOKEN": gateway.token}
    argv = [sys.executable, str(EXAMPLE), "--url", gateway.url, "--run", "onboarding-7"]
    argv += ["--case", "case-mcp-4", "--owner", "owner4@acme.test"]
    runs = [subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)]
    runs.append(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120))
    for run in runs:
        assert run.returncode == 0, run.stderr
    first, second = ([json.loads(line) for line in r.stdout.splitlines()] for r in runs)
    assert [a["tool"] for a in first] == ["crm_close_case_v1", "email_send_v1"]
    assert all(a["asked_before"] for a in second)  # the second run sent nothing
    assert [a["op_id"] for a in first] == [a["op_id"] for a in second]
    acts = sandbox.by_act()
    assert sum(n for k, n in acts.items() if k.endswith(":close:case-mcp-4")) == 1
    assert sum(n for k, n in acts.items() if k.endswith(":owner4@acme.test")) == 1
