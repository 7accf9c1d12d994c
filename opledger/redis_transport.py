"""kombu's Redis transport, with one Redis client per channel instead of one per message.

kombu's Redis channel builds a fresh `redis.Redis` client for each message it puts on a
queue and each event it publishes (`Channel.conn_or_acquire`). With redis-py 5 and later
that object alone costs about 0.3 ms of CPU to build (its table of response callbacks), and
a task pays it several times: the dispatch message and its "task-sent" event where it is
published, the "received", "started" and "succeeded" events and the acknowledgement in the
worker. This transport keeps one client per channel, over the channel's own connection
pool (a redis-py client may be shared between threads: each command takes a connection
from the pool), and builds another only when that pool was replaced (a reconnect).
Everything else is kombu's.

opledger's own Celery app uses it for `redis://` and `rediss://` brokers
(`broker_transport`, from `transport_for`); an app of your own opts in with the same
setting: `app.conf.broker_transport = "opledger.redis_transport:Transport"`.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

#: the broker URL schemes kombu serves with its Redis transport (not Sentinel)
REDIS_SCHEMES = ("redis", "rediss")
#: what `broker_transport` names for them
TRANSPORT = "opledger.redis_transport:Transport"


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


def transport_for(broker_url: str | None) -> str | None:
    """The `broker_transport` for a broker at `broker_url`: this module's for Redis,
    else None (kombu's own, from the URL's scheme)."""
    scheme = (broker_url or "").split(":", 1)[0]
    return TRANSPORT if scheme in REDIS_SCHEMES else None
