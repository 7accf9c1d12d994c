"""Run the sandbox providers.

`python -m opledger.dev.sandbox [--host H] [--port P] [--smtp-port S]`

Prints one JSON line with the bound addresses, then serves until interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys

import uvicorn
from aiosmtpd.controller import Controller

from .mail import SmtpHandler
from .server import build_app


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def serve(
    host: str = "127.0.0.1", port: int = 0, smtp_port: int = 0, keepalive_timeout: float = 5.0
) -> None:
    """Serve until interrupted. `keepalive_timeout`: seconds an idle kept-alive HTTP
    connection stays open before the server closes it (a client sending on it just then
    loses the request before it left)."""
    port = port or _free_port(host)
    smtp_port = smtp_port or _free_port(host)
    smtp = Controller(SmtpHandler(), hostname=host, port=smtp_port)
    smtp.start()
    config = uvicorn.Config(
        build_app(),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=keepalive_timeout,  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)
    print(
        json.dumps({"http": f"http://{host}:{port}", "smtp_host": host, "smtp_port": smtp_port}),
        flush=True,
    )
    try:
        asyncio.run(server.serve())
    finally:
        smtp.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="opledger-sandbox", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--smtp-port", type=int, default=0)
    parser.add_argument(
        "--keepalive-timeout",
        type=float,
        default=5.0,
        help="seconds before an idle kept-alive connection is closed by the server",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    serve(args.host, args.port, args.smtp_port, args.keepalive_timeout)


if __name__ == "__main__":
    main()
