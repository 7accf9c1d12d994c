"""Round trips to Postgres counted on the wire: libpq traces every protocol message, and
each ReadyForQuery from the server ends one round trip."""

from __future__ import annotations

import tempfile
from typing import Any

from psycopg import pq


class WireCounter:
    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by the fixture
        self.mark = 0

    def attach(self, dbapi_connection: Any, _record: Any) -> None:
        pgconn = dbapi_connection.pgconn
        pgconn.trace(self.file.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

    def start(self) -> None:
        self.file.seek(0, 2)
        self.mark = self.file.tell()

    def messages(self) -> list[str]:
        self.file.seek(self.mark)
        return self.file.read().decode(errors="replace").splitlines()

    def round_trips(self) -> int:
        return sum(1 for line in self.messages() if "\tReadyForQuery" in line)
