"""The name 0.1.0 gave the upstream's `OPLEDGER_ADAPTERS` factory,
`opledger.mcp.upstream:build_registry`, kept so a deployment configured with it still
starts. The factory, the upstream file and its adapter are `opledger.adapters.mcp`."""

from opledger.adapters.mcp import build_registry

__all__ = ["build_registry"]
