"""Exactly one beat: a Postgres advisory lock held for the beat's whole life.

The lock lives on one connection. If Postgres restarts, that connection (and the lock) is
gone, so a guard thread checks it and takes the lock again; if another beat got there
first, this one exits at once.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import psycopg
from sqlalchemy.engine import make_url

BEAT_LOCK_KEY = 0x6F706C6564676572  # "opledger"

log = logging.getLogger("opledger.beat")


class BeatLockTaken(RuntimeError):
    """Another beat holds the lock."""


class BeatLock:
    def __init__(self, url: str, *, check_every: float = 2.0) -> None:
        self._libpq = (
            make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        self._check_every = check_every
        self._stop = threading.Event()
        self._conn = self._take()
        self._thread = threading.Thread(target=self._guard, name="beat-lock", daemon=True)
        self._thread.start()

    def _take(self) -> psycopg.Connection:
        conn = psycopg.connect(self._libpq, autocommit=True, connect_timeout=5)
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", [BEAT_LOCK_KEY]).fetchone()
        if not row or not row[0]:
            conn.close()
            raise BeatLockTaken("another opledger beat is running against this ledger")
        return conn

    def _guard(self) -> None:
        while not self._stop.wait(self._check_every):
            try:
                self._conn.execute("SELECT 1")
                continue
            except psycopg.Error:
                log.warning("the beat's lock connection is gone: taking the lock again")
            try:
                self._conn = self._take()
            except BeatLockTaken:
                log.error("another beat took the lock while the database was away: exiting")
                os._exit(1)
            except psycopg.Error:
                time.sleep(self._check_every)  # the database is still away; sweeps wait too

    def release(self) -> None:
        self._stop.set()
        self._conn.close()
