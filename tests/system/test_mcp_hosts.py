"""MCP hosts as they are, against `opledger mcp serve` in a process of its own, real
workers and the sandbox CRM — counted at the provider.

A host that cannot set a call's `_meta` (a desktop host configured by a JSON file) uses a
client whose run mode is `token`: over HTTP and over stdio, an answer it lost is asked
again on a new connection, and the host killed mid-call and started again asks again;
each time the case is updated once. A host written with the TypeScript SDK
(examples/mcp_host.mjs on node, the SDK installed from tests/system/mcp_host's lock file)
sees a gateway SIGKILLed mid-call as a failed request, not as a stream it waits on until
its own timeout, and the call it asks again of a new gateway gets the same operation.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from opledger.dev.processes import free_port, listening, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger
from opledger.mcp.clients import TOKEN, Caller, add_client
from tests.system.test_mcp_gateway import Gateway, gateway, module_gateway, updates

__all__ = ["gateway", "module_gateway"]  # the MCP gateway tests' fixtures, shared

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "mcp_host.mjs"
SOURCE = Path(__file__).with_name("mcp_host")
PREFIX = REPO / ".opledger" / "npm" / "mcp-host"  # gitignored, like the Stripe mock's
UPDATE = "crm_update_case_v1"
#: the host's own request timeout: far longer than any wait of these tests, so a call that
#: fails before it failed on the transport, not by running out of time
HOST_TIMEOUT_MS = 120_000
STDIO = [sys.executable, "-m", "opledger.cli", "mcp", "serve", "--transport", "stdio"]


def payload(note: str) -> dict[str, Any]:
    return {"fields": {"status": "resolved"}, "note": note}


@pytest.fixture(scope="module")
def desk(module_gateway: Gateway) -> str:
    """The token of a host that cannot set `_meta`: its client's run mode is `token`."""
    return add_client(module_gateway.clients, Caller("desk", "acme", "auth_acme", run_mode=TOKEN))


@pytest.fixture(scope="module")
def host() -> Path:
    """examples/mcp_host.mjs, beside the TypeScript SDK installed with `npm ci` from the
    committed lock file (once; again when the lock file changes)."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        why = f"{' and '.join(missing)} not installed: the TypeScript host needs Node.js"
        if os.environ.get("CI"):
            raise RuntimeError(why)
        pytest.skip(why)
    PREFIX.mkdir(parents=True, exist_ok=True)
    lock = (SOURCE / "package-lock.json").read_bytes()
    with (PREFIX / ".install.lock").open("w") as guard:  # two pytest processes at once
        fcntl.flock(guard, fcntl.LOCK_EX)
        installed = PREFIX / "node_modules" / ".opledger-lock.json"
        if not (installed.exists() and installed.read_bytes() == lock):
            for name in ("package.json", "package-lock.json"):
                shutil.copyfile(SOURCE / name, PREFIX / name)
            argv = ["npm", "ci", "--prefix", str(PREFIX), "--ignore-scripts", "--no-audit"]
            done = subprocess.run([*argv, "--no-fund"], capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"npm ci failed:\n{done.stderr[-2000:]}"
            installed.write_bytes(lock)
        script = PREFIX / EXAMPLE.name  # node resolves the SDK from the script's directory
        shutil.copyfile(EXAMPLE, script)
    return script


def node_host(
    script: Path, env: dict[str, str], case: str, *, run: str | None, stdio: bool = False
) -> subprocess.Popen[str]:
    """examples/mcp_host.mjs updating `case`, in a process group of its own (a host killed
    takes the stdio server it launched with it)."""
    argv = ["node", str(script), "--tool", UPDATE, "--target", case]
    argv += ["--payload", json.dumps(payload("the host")), "--timeout-ms", str(HOST_TIMEOUT_MS)]
    argv += ["--run", run] if run else []
    argv += ["--stdio", "--", *STDIO, "--wait", "15"] if stdio else []
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def answers(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """The host's lines, once it has exited (its own timeout is far longer than this)."""
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError("the host's call neither answered nor failed in 90 s") from None
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines, f"the host printed nothing (exit {proc.returncode}):\n{err[-2000:]}"
    return lines


def host_env(gw: Gateway, token: str) -> dict[str, str]:
    """What a host is configured with: the token, and for a stdio launch every OPLEDGER_
    variable the workers have (the gateway needs their database, broker, adapters and
    schema) and the clients file. Nothing else of this process's environment."""
    opledger = {k: v for k, v in gw.stack.env.items() if k.startswith("OPLEDGER_")}
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/"),
        **opledger,
        "OPLEDGER_MCP_CLIENTS": str(gw.clients),
        "OPLEDGER_MCP_TOKEN": token,
        "OPLEDGER_MCP_URL": gw.url,
    }


def recorded(ledger: Ledger, workflow_id: str, case: str) -> str | None:
    ops = ledger.list(limit=100)
    return next((o.id for o in ops if o.workflow_id == workflow_id and o.target == case), None)


def once(ledger: Ledger, sandbox: Sandbox, case: str, answer: dict[str, Any], run: str) -> None:
    """`case` has one operation, the one `answer` gives (asked before: this is a call asked
    again), in `run`, confirmed; and the CRM updated the case once."""
    ops = [(o.id, o.workflow_id) for o in ledger.list(limit=100) if o.target == case]
    assert ops == [(answer["op_id"], run)]
    assert (answer["asked_before"], answer["kind"]) == (True, "confirmed"), answer
    assert updates(sandbox, case) == 1


def kill_mid_call(proc: subprocess.Popen[str], ledger: Ledger, workflow_id: str, case: str) -> str:
    """SIGKILL a host (and what it launched) once its call is recorded: the operation."""
    op_id = wait_until(lambda: recorded(ledger, workflow_id, case), 30, "the call recorded")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    return cast(str, op_id)


def final(lines: list[dict[str, Any]]) -> dict[str, Any]:
    assert all(not a["isError"] for a in lines), lines
    return lines[-1]


def lost_over_http(gw: Gateway, token: str, case: str) -> None:
    """A call without `_meta` whose answer never arrives: the host gives up after 0.9 s,
    before the worker's own 1 s provider timeout lets anything settle."""

    async def go() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=0.9) as http,
            Client(streamable_http_client(gw.url, http_client=http)) as c,
        ):
            await c.call_tool(UPDATE, {"target": case, "payload": payload("lost")})

    with pytest.raises(BaseException):  # noqa: B017 (the SDK's transport error, grouped)
        anyio.run(go)


def test_a_host_without_meta_over_http_loses_an_answer_and_restarts_and_each_act_is_once(
    gateway: Gateway, desk: str, host: Path, sandbox: Sandbox, sys_ledger: Ledger
) -> None:
    sandbox.fault("crm", "delay_after_commit", delay_s=4)  # applied, answered 4 s later
    lost_over_http(gateway, desk, "case-host-1")
    # asked again on a new connection, by a host that names no run either
    again = final(answers(node_host(host, host_env(gateway, desk), "case-host-1", run=None)))
    once(sys_ledger, sandbox, "case-host-1", again, "mcp:desk")
    # a host killed mid-call and started again
    env = host_env(gateway, desk)
    op_id = kill_mid_call(
        node_host(host, env, "case-host-2", run=None), sys_ledger, "mcp:desk", "case-host-2"
    )
    restarted = final(answers(node_host(host, env, "case-host-2", run=None)))
    assert restarted["op_id"] == op_id
    once(sys_ledger, sandbox, "case-host-2", restarted, "mcp:desk")


def test_a_host_without_meta_over_stdio_loses_an_answer_and_restarts_and_each_act_is_once(
    gateway: Gateway, desk: str, host: Path, sandbox: Sandbox, sys_ledger: Ledger
) -> None:
    """The stdio server launched as hosts launch it: by the TypeScript SDK's stdio
    transport (whose server gets only the variables the host passes on), and by the
    Python SDK's."""
    sandbox.fault("crm", "delay_after_commit", delay_s=4)
    env = host_env(gateway, desk)
    params = StdioServerParameters(command=STDIO[0], args=[*STDIO[1:], "--wait", "15"], env=env)

    async def lose() -> None:
        async with Client(params) as c:
            args = {"target": "case-host-3", "payload": payload("lost")}
            await c.call_tool(UPDATE, args, read_timeout_seconds=0.9)

    with pytest.raises(BaseException):  # noqa: B017 (the SDK's timeout, grouped)
        anyio.run(lose)  # the host gives up and closes the server it launched
    again = final(answers(node_host(host, env, "case-host-3", run=None, stdio=True)))
    once(sys_ledger, sandbox, "case-host-3", again, "mcp:desk")
    op_id = kill_mid_call(
        node_host(host, env, "case-host-4", run=None, stdio=True),
        sys_ledger,
        "mcp:desk",
        "case-host-4",
    )
    restarted = final(answers(node_host(host, env, "case-host-4", run=None, stdio=True)))
    assert restarted["op_id"] == op_id
    once(sys_ledger, sandbox, "case-host-4", restarted, "mcp:desk")


def test_a_typescript_host_sees_a_killed_gateway_fail_its_call_and_the_reissued_call_is_the_same(
    gateway: Gateway, host: Path, sandbox: Sandbox, sys_ledger: Ledger
) -> None:
    sandbox.fault("crm", "delay_after_commit", delay_s=4)
    env = host_env(gateway, gateway.token)
    proc = node_host(host, env, "case-host-5", run="run-ts")
    op_id = wait_until(
        lambda: recorded(sys_ledger, "mcp:bot:run-ts", "case-host-5"), 30, "the call recorded"
    )
    gateway.kill()  # SIGKILL, mid-call: the gateway waits up to 15 s for the answer
    failed = answers(proc)  # long before the host's own 120 s timeout could run out
    assert proc.returncode == 3, failed
    assert failed[-1]["error"] == "transport", failed
    gateway.start()  # a new gateway process, same port
    again = final(answers(node_host(host, env, "case-host-5", run="run-ts")))
    assert again["op_id"] == op_id
    once(sys_ledger, sandbox, "case-host-5", again, "mcp:bot:run-ts")


REFUSING = SOURCE / "refusing_status.py"


def test_a_host_whose_status_poll_is_refused_exits_1(host: Path, tmp_path: Path) -> None:
    """The call was answered pending and the poll that follows it refused: the host says
    so (exit 1) instead of ending as if it had an answer (no gateway of ours refuses a poll
    of its own op_id: a stand-in does)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, str(REFUSING), "--port", str(port)])
    try:
        wait_until(lambda: listening(port) or server.poll() is not None, 30, "the stand-in")
        assert server.poll() is None, "the stand-in gateway did not start"
        env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")}
        env |= {
            "OPLEDGER_MCP_TOKEN": "opl_mcp_any",
            "OPLEDGER_MCP_URL": f"http://127.0.0.1:{port}/mcp",
        }
        argv = ["node", str(host), "--tool", UPDATE, "--target", "case-host-6", "--run", "r"]
        argv += ["--payload", json.dumps(payload("refused poll")), "--polls", "3"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    finally:
        server.kill()
        server.wait()
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(a["tool"], a["isError"]) for a in lines] == [
        (UPDATE, False),
        ("opledger_status", True),  # one refusal, not a poll after it
    ], done.stderr
    assert lines[0]["kind"] == "pending"
    assert done.returncode == 1, lines
