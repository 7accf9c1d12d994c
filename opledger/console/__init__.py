"""`opledger console`: the review queue in a browser, on the same `ledger.reviews` API the
CLI uses.

- `accounts`: operators (argon2 password hashes, tenant scope) and server-side sessions;
- `redaction`: which payload fields the console hides, per action;
- `app`: the ASGI app (Starlette, server-rendered Jinja2 templates, no JavaScript needed).

Nothing in the ledger, the adapters or the tasks imports this package; its web
dependencies are the `[console]` extra.
"""
