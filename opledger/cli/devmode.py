"""Development mode (`OPLEDGER_DEV=1`): the one door from the runtime commands into the
development tooling.

Only in development mode does an unset `OPLEDGER_DATABASE_URL` or `OPLEDGER_BROKER_URL`
mean the local Postgres or Redis, or an embedded one `opledger.dev.devstack` starts, and
does `opledger worker` arm the crash points `OPLEDGER_CRASHPOINT` names
(`opledger.dev.crashpoints`); the import happens then, never in a production process
(import-linter lets this module, and `opledger.cli.dev`'s development commands, reach
`opledger.dev`; nothing else in the CLI).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opledger.tasks.hooks import Hooks


def ledger_database_url() -> str:
    """The development ledger database: the local Postgres's, or an embedded one's."""
    from opledger.dev import devstack

    return devstack.ledger_database_url()


def redis_url() -> str:
    """The development broker: the local Redis, or an embedded one."""
    from opledger.dev import devstack

    return devstack.redis_url()


class CrashPointsOutsideDev(RuntimeError):
    """`OPLEDGER_CRASHPOINT` is set outside development mode."""


def crash_hooks(environ: Mapping[str, str] | None = None, *, dev: bool) -> Hooks | None:
    """A development worker's hooks with the crash points `OPLEDGER_CRASHPOINT` arms
    (`opledger.dev.crashpoints`), or None when it is unset: then nothing of the development
    tooling is imported. Set outside development mode (`dev` false) it is refused
    (`CrashPointsOutsideDev`): a production worker never kills itself on a stray variable.
    A malformed value is a ValueError naming the known points."""
    env = os.environ if environ is None else environ
    if not env.get("OPLEDGER_CRASHPOINT", "").strip():
        return None
    if not dev:
        raise CrashPointsOutsideDev(
            "OPLEDGER_CRASHPOINT arms crash points, which are development tooling: set "
            "OPLEDGER_DEV=1 as well to arm them, or unset OPLEDGER_CRASHPOINT"
        )
    from opledger.dev import crashpoints

    points = crashpoints.from_environ(env)
    return None if points is None else crashpoints.worker_hooks(points)
