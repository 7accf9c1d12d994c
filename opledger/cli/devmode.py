"""Development mode (`OPLEDGER_DEV=1`): the one door from the runtime commands into the
development tooling.

Only in development mode does an unset `OPLEDGER_DATABASE_URL` or `OPLEDGER_BROKER_URL`
mean the local Postgres or Redis, or an embedded one `opledger.dev.devstack` starts; the
import happens then, never in a production process (import-linter lets this module, and
`opledger.cli.dev`'s development commands, reach `opledger.dev`; nothing else in the CLI).
"""

from __future__ import annotations


def ledger_database_url() -> str:
    """The development ledger database: the local Postgres's, or an embedded one's."""
    from opledger.dev import devstack

    return devstack.ledger_database_url()


def redis_url() -> str:
    """The development broker: the local Redis, or an embedded one."""
    from opledger.dev import devstack

    return devstack.redis_url()
