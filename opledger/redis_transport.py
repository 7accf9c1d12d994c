"""kombu's Redis transport with one Redis client per channel instead of one per message.

kombu's Redis channel builds a fresh `redis.Redis` client for each message it puts on a
queue and each event it publishes (`Channel.conn_or_acquire`). With redis-py 5 and later
that object alone costs about 0.3 ms of CPU to build (its table of response callbacks), and
a task pays it several times: the dispatch message and its "task-sent" event where it is
published, the "received", "started" and "succeeded" events and the acknowledgement in the
worker. `Channel` keeps one client per channel, over the channel's own connection pool (a
redis-py client may be shared between threads: each command takes a connection from the
pool), and builds another only when that pool was replaced (a reconnect). Everything else
is kombu's.

`keep_one_client_per_channel()` has kombu serve `redis://` and `rediss://` with this
`Transport`; opledger's Celery configuration calls it when it loads (`opledger.celeryconfig`)
and so does `opledger.tasks.register(app)`, so it holds in every process that runs or
publishes opledger's tasks, for every Redis broker connection in that process. The
transport is still named `redis` (URLs, the worker's "Connected to redis://" line and
Flower's broker page read that), and this module — with redis-py, which imports
OpenTelemetry when it is installed — is imported only when a Redis connection is made.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _kept_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the consumer's own client: kombu keeps it already
            return super()._create_client(asynchronous=True)
        pool = self.pool
        kept = self._kept_client
        if kept is None or kept.connection_pool is not pool:
            kept = self._kept_client = super()._create_client()
        return kept


class Transport(kombu_redis.Transport):
    Channel = Channel
