"""A stand-in upstream MCP server for the proxy's system test, written with the MCP SDK as
any MCP server is: `create_ticket` has an effect (each call appends to the state file, and
while a `slow` file exists next to it, it answers only after 5 s — longer than the proxy's
workers wait: the answer is lost); `count_tickets` only reads.

    python tests/system/upstream_mcp.py --port 9000 --state /tmp/tickets.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", type=Path, required=True)
    args = parser.parse_args()
    state: Path = args.state
    server = MCPServer("tickets")

    def calls() -> list[dict[str, Any]]:
        return json.loads(state.read_text()) if state.exists() else []

    @server.tool()
    async def create_ticket(project: str, title: str, body: str = "") -> dict[str, Any]:
        """Open a ticket in a project."""
        made = [*calls(), {"project": project, "title": title}]
        state.write_text(json.dumps(made))
        if (state.parent / "slow").exists():
            await asyncio.sleep(5)
        return {"ticket": f"T-{len(made)}", "project": project}

    @server.tool()
    def count_tickets(project: str) -> dict[str, Any]:
        """How many tickets a project has."""
        return {"count": sum(1 for c in calls() if c["project"] == project)}

    app = server.streamable_http_app(stateless_http=True)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
