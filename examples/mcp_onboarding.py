"""The onboarding agent through the MCP gateway: close a case, and once the close is
confirmed, email its owner — from any process that speaks MCP, here the MCP SDK's client.

The agent names its run (`_meta["opledger/run"]`) and nothing else about the effect: the
gateway keys each call by the run and the act, never by the request id, so running this
again with the same run (after a crash, a lost answer, a restart) gets the recorded
operations back and sends nothing twice. Each tool is named after its action as a model API
names a function: `crm.close_case.v1` is the tool `crm_close_case_v1`. Start the gateway
and a worker first:

    opledger mcp token --agent onboarding --tenant acme --grant auth_acme --file clients.json
    OPLEDGER_MCP_CLIENTS=clients.json opledger mcp serve --port 8765
    OPLEDGER_MCP_TOKEN=<the token> python -m opledger.examples.mcp_onboarding --run onboarding-42

Prints each tool's answer (its structured content) as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, cast

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import RequestParamsMeta

RUN_META = "opledger/run"


async def onboard(url: str, token: str, run: str, case: str, owner: str) -> int:
    meta = cast(RequestParamsMeta, {RUN_META: run})
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):

        async def act(tool: str, target: str, payload: dict[str, Any]) -> dict[str, Any]:
            result = await client.call_tool(tool, {"target": target, "payload": payload}, meta=meta)
            answer = cast(dict[str, Any], result.structured_content)
            print(json.dumps({"tool": tool, **answer}, sort_keys=True), flush=True)
            return answer

        closed = await act("crm_close_case_v1", case, {"note": "onboarding complete"})
        while closed["kind"] == "pending":  # the call waited as long as the gateway does
            result = await client.call_tool(
                "opledger_status", {"op_id": closed["op_id"], "wait": 20}, meta=meta
            )
            closed = cast(dict[str, Any], result.structured_content)
        if closed["kind"] != "confirmed":
            return 1  # rejected, or unknown: a person has it; never close it another way
        sent = await act(
            "email_send_v1",
            owner,
            {"to": owner, "subject": f"{case} is closed", "text": "Welcome aboard."},
        )
        return 0 if sent["kind"] in ("confirmed", "pending") else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", default=os.environ.get("OPLEDGER_MCP_URL", "http://127.0.0.1:8765/mcp")
    )
    parser.add_argument("--run", required=True, help="your run's id (the same on every retry)")
    parser.add_argument("--case", default="case-318")
    parser.add_argument("--owner", default="owner@acme.test")
    args = parser.parse_args(argv)
    token = os.environ.get("OPLEDGER_MCP_TOKEN")
    if not token:
        print("set OPLEDGER_MCP_TOKEN to the agent's token (opledger mcp token)", file=sys.stderr)
        return 2
    return anyio.run(onboard, args.url, token, args.run, args.case, args.owner)


if __name__ == "__main__":
    sys.exit(main())
