"""The MCP gateway (`opledger mcp serve`): the actions of the configured adapters as Model
Context Protocol tools, each call an effect caused once.

MCP gives a tool call no idempotency key, and a client that loses a response re-issues the
call as a new request with a new id. So the gateway never keys an effect by a request id:
the intent is the caller's run (the `opledger/run` entry of the call's `_meta`, tied to
the caller's credentials; for a host that cannot set `_meta`, what its client's run mode
in the clients file says: one run of the client's own, or a `run` argument) plus the act
(`opledger.ledger.intents`), and the same call asked again — re-issued, retried after a
lost answer, sent again by a restarted agent — returns the operation it recorded and how
it stands.

`clients` (who may call: a token per agent, tied to a tenant and a grant) needs nothing
else; `tools`, `server` and `proxy` (`opledger mcp proxy`, in front of an existing MCP
server) need the `[mcp]` extra (the official MCP SDK). The workers' side of the proxy, the
adapter that calls the upstream's tools, is among the adapters: `opledger.adapters.mcp`.
"""
