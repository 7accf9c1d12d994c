"""`opledger mcp`: the MCP gateway (`serve`) and the tokens of the agents that call it."""

from __future__ import annotations

import importlib.util
import math
import os
from typing import Annotated

import typer

from opledger.adapters.mcp import Upstream, load_upstream
from opledger.adapters.registry import Registry
from opledger.mcp.clients import META, RUN_MODES, Caller, Clients, add_client
from opledger.settings import NotConfigured, get_settings

from .app import app, err_console, missing_extra, open_ledger

mcp_app = typer.Typer(help="The MCP gateway: the adapters' actions as MCP tools, each call once.")
app.add_typer(mcp_app, name="mcp")

#: the stdio transport's caller: the token of one client of the clients file
TOKEN_ENV = "OPLEDGER_MCP_TOKEN"
#: a `--wait` longer than this is warned about at start: a call's answer is one HTTP body
#: held open until then, and hosts (the TypeScript SDK) and proxies (nginx) give up at 60 s
WAIT_WARN_SECONDS = 45.0


def _clients() -> Clients:
    path = get_settings().mcp_clients
    if not path:
        raise NotConfigured(
            "OPLEDGER_MCP_CLIENTS is not set: name the clients file (`opledger mcp token` "
            "makes one)"
        )
    return Clients(path)


def _require_extra() -> None:
    for name in ("mcp", "uvicorn", "jsonschema"):
        if importlib.util.find_spec(name) is None:
            raise missing_extra("opledger mcp serve: the MCP gateway", "mcp", name)


TransportOption = Annotated[
    str, typer.Option(help="http (streamable HTTP) or stdio (one caller: OPLEDGER_MCP_TOKEN).")
]
HostOption = Annotated[str, typer.Option(help="Address to bind (loopback by default).")]
PortOption = Annotated[int, typer.Option(help="HTTP port.")]
PathOption = Annotated[str, typer.Option(help="The endpoint's path.")]
PublicUrlOption = Annotated[
    str | None, typer.Option(help="The URL clients reach it at (default: from host and port).")
]
WaitOption = Annotated[
    float,
    typer.Option(
        help="Seconds a call waits for its effect to settle before it answers pending "
        "(the agent then asks opledger_status). Keep it under 45 s: hosts and proxies give "
        "up at 60 s."
    ),
]


def _caller_setup(transport: str, wait: float) -> tuple[Clients, str]:
    """The clients file and, for stdio, the one caller's token (refused when it names none)."""
    if transport not in ("http", "stdio"):
        raise typer.BadParameter("--transport is http or stdio")
    if not math.isfinite(wait) or wait < 0:
        raise typer.BadParameter("--wait is a number of seconds, 0 or more")
    if wait > WAIT_WARN_SECONDS:
        err_console.print(
            f"opledger mcp: warning: --wait {wait:g} is more than {WAIT_WARN_SECONDS:g} s. A "
            "call's answer is held open that long, and hosts (the TypeScript SDK) and proxies "
            "(nginx) give up after 60 s by default: the host sees a failed call and must ask "
            f"again. Keep --wait under {WAIT_WARN_SECONDS:g} s (a slow effect answers pending; "
            "the agent then asks opledger_status).",
            markup=False,
        )
    _require_extra()
    settings = get_settings()
    if not settings.dev:  # it publishes each new operation to the workers: never late
        settings.require_broker_url()
    clients = _clients()
    token = os.environ.get(TOKEN_ENV, "")
    if transport == "stdio" and clients.caller_for(token) is None:
        raise NotConfigured(f"stdio serves one caller: set {TOKEN_ENV} to a client's token")
    return clients, token


@mcp_app.command("serve")
def serve(
    transport: TransportOption = "http",
    host: HostOption = "127.0.0.1",
    port: PortOption = 8765,
    path: PathOption = "/mcp",
    public_url: PublicUrlOption = None,
    wait: WaitOption = 20.0,
) -> None:
    """Serve the configured adapters' actions as MCP tools; every call is an effect of the
    caller's run, caused once (asked again, it answers how the first call's act stands).

    Each caller is an entry of the clients file (OPLEDGER_MCP_CLIENTS): its bearer token
    decides the tenant and the grant. Calls are published to the workers like any effect."""
    clients, token = _caller_setup(transport, wait)
    url = public_url or f"http://{host}:{port}"
    _serve(clients, transport, host, port, path, url, wait, token)


def _serve(
    clients: Clients,
    transport: str,
    host: str,
    port: int,
    path: str,
    public_url: str,
    wait: float,
    token: str,
    upstream: Upstream | None = None,
) -> None:
    import anyio
    import uvicorn

    from opledger.agents.effects import Effects
    from opledger.mcp.server import (
        Gateway,
        http_app,
        identify_as,
        identify_by_token,
        proxied_actions,
        serve_stdio,
    )
    from opledger.observability import tracing

    if tracing.wanted():
        tracing.configure(service_name="opledger-mcp")
    with open_ledger(pool_size=8) as ledger:
        registry = ledger.actions
        assert isinstance(registry, Registry)  # open_ledger wires the adapter registry
        effects = Effects(ledger)
        identify = identify_as(clients, token) if transport == "stdio" else identify_by_token
        gateway: Gateway
        if upstream is None:
            gateway = Gateway(effects, registry, identify, wait=wait)
            proxied = proxied_actions(registry)
            if proxied:
                err_console.print(
                    f"opledger mcp: {', '.join(proxied)} not offered: an MCP upstream's tools "
                    "are `opledger mcp proxy`'s, with the upstream's own input schemas",
                    markup=False,
                )
        else:
            from opledger.mcp.proxy import Proxy, upstream_tools

            tools = anyio.run(upstream_tools, upstream)
            gateway = Proxy(effects, registry, identify, wait=wait, upstream=upstream, tools=tools)
        if transport == "stdio":
            anyio.run(serve_stdio, gateway)
            return
        web = http_app(gateway, clients, host=host, path=path, public_url=public_url)
        what = "mcp proxy" if upstream is not None else "mcp"
        err_console.print(f"opledger {what} on http://{host}:{port}{path}", markup=False)
        uvicorn.run(web, host=host, port=port, log_level="warning", proxy_headers=False)


@mcp_app.command("proxy")
def proxy(
    transport: TransportOption = "http",
    host: HostOption = "127.0.0.1",
    port: PortOption = 8766,
    path: PathOption = "/mcp",
    public_url: PublicUrlOption = None,
    wait: WaitOption = 20.0,
) -> None:
    """In front of an existing MCP server (OPLEDGER_MCP_UPSTREAM): its read-only tools
    passed through, each tool the file marks as having effects caused once through the
    ledger (the workers call the upstream; an answer never read is unknown and goes to a
    person). Run the proxy and the workers with
    OPLEDGER_ADAPTERS=opledger.adapters.mcp:build_registry."""
    clients, token = _caller_setup(transport, wait)
    source = get_settings().mcp_upstream
    if not source:
        raise NotConfigured("OPLEDGER_MCP_UPSTREAM is not set: name the upstream file")
    upstream = load_upstream(source)
    url = public_url or f"http://{host}:{port}"
    _serve(clients, transport, host, port, path, url, wait, token, upstream)


@mcp_app.command("token")
def token_command(
    agent: Annotated[str, typer.Option(help="The agent this token is for (one token each).")],
    tenant: Annotated[str, typer.Option(help="The tenant its effects are for.")],
    grant: Annotated[str, typer.Option(help="The grant its effects are written under.")],
    clients_file: Annotated[
        str | None,
        typer.Option("--file", help="The clients file (default: OPLEDGER_MCP_CLIENTS)."),
    ] = None,
    run: Annotated[
        str,
        typer.Option(
            "--run",
            help="How its calls name their run: meta (the call's _meta['opledger/run']), "
            "token (no naming: every call of this agent is in one run of its own, each act "
            "once for good) or argument (each tool has a required run argument the host or "
            "the model sets). A call's _meta, when set, wins over token and argument.",
        ),
    ] = META,
) -> None:
    """Make a bearer token for an agent and add it to the clients file; the token is
    printed once (the file keeps its sha256 only)."""
    target = clients_file or get_settings().mcp_clients
    if not target:
        raise typer.BadParameter("name the clients file: --file or OPLEDGER_MCP_CLIENTS")
    if run not in RUN_MODES:
        raise typer.BadParameter(f"--run is one of {', '.join(RUN_MODES)}")
    caller = Caller(agent=agent, tenant=tenant, grant=grant, run_mode=run)
    made = add_client(target, caller)
    err_console.print(
        f"added {agent} ({tenant}, grant {grant}, run: {run}) to {target}", markup=False
    )
    typer.echo(made)
