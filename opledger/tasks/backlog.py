"""What the relay and the sweep need from the broker to avoid multiplying a backlog.

- `queue_depth`: messages waiting in a queue, through kombu (`queue_declare(passive=True)`
  answers with the message count on Redis — the sum of its priority lists — and on
  RabbitMQ alike). A queue that does not exist holds nothing (Redis drops an empty list).
- `Generations`: the generation of the latest message published for an operation, so a
  worker can drop a superseded duplicate without a database round trip.

Dropping is safe because the relay writes an operation's generation only *after* the newer
message was handed to the broker: a dropped message always has a newer one behind it. If
the broker loses that newer message (a restart, a wipe), the generation is lost with it
when it lives in the same Redis; and if it survives, the operation is still `prepared`, so
the relay publishes it once more after its backoff (at most 2^RELAY_MAX_DOUBLINGS times
the relay's `after`). A store that cannot be read never drops anything.

On RabbitMQ (or any broker that is not Redis) there is no store: nothing is recorded and
nothing dropped, and a superseded duplicate costs one refused claim. That is deliberate:
a generation kept in Postgres would cost the worker the same round trip as the refused
claim it saves.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any

log = logging.getLogger("opledger.tasks")

#: the header every dispatch/reconcile message carries: when it was published (epoch s)
SENT_HEADER = "opledger_sent"


def queue_depth(app: Any, queue: str) -> int | None:
    """Messages waiting in `queue`; None when the broker cannot be read.

    Read on a connection and channel this process keeps for it (`_DepthReader`): a new
    connection for each read cost the sweep and the relay a connect, a handshake and a
    channel every cycle, more than the rest of an idle cycle. A kept connection the
    broker dropped (a restart) is opened again once within the same read."""
    from amqp.exceptions import NotFound
    from kombu.exceptions import ChannelError

    reader = _DepthReader.of(app)
    for last in (False, True):
        try:
            return int(reader.channel().queue_declare(queue=queue, passive=True).message_count)
        except (ChannelError, NotFound):
            reader.after_refusal()
            return 0  # no such queue: nothing waiting (Redis drops an empty list)
        except Exception as exc:  # an unreadable broker only disables the guard
            reader.drop()
            if last:
                log.warning("cannot read the depth of queue %s: %s", queue, exc)
    return None


class _DepthReader:
    """The broker connection and channel one thread of one process reads queue depths on,
    per app (a channel is not shared between threads: a worker of the threads pool runs a
    sweep and a relay at once); made anew in a forked child (never one shared across a
    fork) and after an error."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.pid = os.getpid()
        self._conn: Any = None
        self._channel: Any = None

    @classmethod
    def of(cls, app: Any) -> _DepthReader:
        key = (id(app), threading.get_ident())
        reader = _readers.get(key)
        if reader is None or reader.pid != os.getpid() or reader.app is not app:
            reader = _readers[key] = cls(app)
        return reader

    def channel(self) -> Any:
        if self._conn is None:
            self._conn = self.app.connection_for_write()
        if self._channel is None:
            self._channel = self._conn.channel()
        return self._channel

    def after_refusal(self) -> None:
        """A missing queue was asked for: RabbitMQ closes the channel that asked (its
        connection stays), Redis keeps it."""
        if self._channel is not None and getattr(self._channel, "is_open", True) is False:
            with contextlib.suppress(Exception):
                self._channel.close()
            self._channel = None

    def drop(self) -> None:
        for part in (self._channel, self._conn):
            if part is not None:
                with contextlib.suppress(Exception):  # one the broker already closed
                    part.close()
        self._conn = self._channel = None


#: the depth reader of each app and thread in this process
_readers: dict[tuple[int, int], _DepthReader] = {}


class Generations:
    """Latest published generation per (kind, operation) in Redis, with a time to live."""

    def __init__(self, url: str | None, ttl_s: int) -> None:
        self.ttl_s = ttl_s
        self._client: Any = None
        if url and url.split(":", 1)[0] in ("redis", "rediss"):
            import redis

            self._client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)

    @staticmethod
    def _key(kind: str, op_id: str) -> str:
        return f"opledger:gen:{kind}:{op_id}"

    def published(self, kind: str, handouts: list[tuple[str, int]]) -> None:
        """Record generations whose messages were just handed to the broker."""
        if self._client is None or not handouts:
            return
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for op_id, gen in handouts:
                    pipe.set(self._key(kind, op_id), gen, ex=self.ttl_s)
                pipe.execute()
        except Exception as exc:  # without them nothing is dropped: safe
            log.warning("cannot record message generations: %s", exc)

    def superseded(self, kind: str, op_id: str, gen: int) -> bool:
        """True only when a newer message than generation `gen` was published."""
        if self._client is None:
            return False
        try:
            latest = self._client.get(self._key(kind, op_id))
        except Exception:  # unreadable: never drop
            return False
        return latest is not None and int(latest) > gen


def message_age(headers: dict[str, Any] | None) -> float | None:
    """Seconds since the message was published, from its header (None without one)."""
    sent = (headers or {}).get(SENT_HEADER)
    if not isinstance(sent, int | float):
        return None
    return max(0.0, time.time() - float(sent))
