"""The statements of the connections a process holds of its own, outside any pool
(`connector.dedicated`): the agents' LISTEN and the beat's advisory lock."""

from __future__ import annotations

from sqlalchemy import text

#: the channel the ledger NOTIFYs an operation's id on when it settles
#: (`opledger_notify_settle` in schema.sql)
SETTLE_CHANNEL = "opledger_settle"

LISTEN_SETTLES = text(f"LISTEN {SETTLE_CHANNEL}")

#: the beat's lock (`pgschema.beat_lock_key`), taken for the connection's whole life
TRY_BEAT_LOCK = text("SELECT pg_try_advisory_lock(:key)")

#: whether the server is a standby (in recovery): advisory locks work there too
IN_RECOVERY = text("SELECT pg_is_in_recovery()")
