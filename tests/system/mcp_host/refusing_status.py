"""A stand-in for the gateway whose status tool refuses every poll (as the gateway refuses
an op_id that reads as no operation of the caller's): its update tool answers `pending`,
so a host follows it with `opledger_status` and is refused. For
tests/system/test_mcp_hosts.py: examples/mcp_host.mjs must exit 1 then, not 0.

    python tests/system/mcp_host/refusing_status.py --port 9000
"""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer

OP_ID = "op_01KBQ0000000000000000000AB"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    server = MCPServer("opledger")

    @server.tool()
    def crm_update_case_v1(target: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Update a case: recorded, not settled yet."""
        return {"kind": "pending", "op_id": OP_ID, "asked_before": False}

    @server.tool()
    def opledger_status(op_id: str, wait: float = 0) -> dict[str, Any]:
        """How an operation stands: refused, always."""
        raise ValueError(f"no operation {op_id}")

    app = server.streamable_http_app(stateless_http=True, json_response=True)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
