"""kombu's Redis transport with one Redis client per channel (`opledger.redis_transport`),
on a real Redis: every message and event reaches the broker as with kombu's own, over one
client per channel (kombu's builds one per message and per event), the transport is still
named `redis` for what reads the URL (the worker's log, Flower), and publishing goes on
across a broker restart."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery
from kombu import transport

from opledger.dev.processes import PrivateRedis
from opledger.queues import REDIS_TRANSPORT, keep_one_client_per_channel
from opledger.redis_transport import Transport


def _app(url: str) -> Celery:
    app = Celery("transport-test", set_as_current=False)
    app.conf.broker_url = url
    app.conf.task_send_sent_event = True  # an event per message: the fanout publish too
    return app


def test_opledgers_celery_configuration_keeps_one_client_per_channel() -> None:
    import opledger.celeryconfig  # noqa: F401 - what every opledger process loads

    assert transport.TRANSPORT_ALIASES["redis"] == REDIS_TRANSPORT
    assert transport.TRANSPORT_ALIASES["rediss"] == REDIS_TRANSPORT
    keep_one_client_per_channel()  # again: nothing changes
    assert transport.get_transport_cls("redis") is Transport


def _served_by(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    monkeypatch.setitem(transport.TRANSPORT_ALIASES, "redis", path)
    monkeypatch.delitem(transport._transport_cache, "redis", raising=False)


@pytest.mark.parametrize("kept", [True, False])
def test_messages_and_events_reach_redis_over_one_client(
    own_redis: PrivateRedis, kept: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _served_by(monkeypatch, REDIS_TRANSPORT if kept else "kombu.transport.redis:Transport")
    built: list[int] = []
    init = redis.Redis.__init__

    def counted(self: redis.Redis, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        init(self, *args, **kwargs)

    app = _app(own_redis.url)
    app.send_task("t.noop", (0,))  # the connection and its channel set up
    events = redis.Redis.from_url(own_redis.url).pubsub()  # type: ignore[no-untyped-call,unused-ignore]
    events.psubscribe("*celeryev*")
    with monkeypatch.context() as counting:
        counting.setattr(redis.Redis, "__init__", counted)
        for n in range(50):
            app.send_task("t.noop", (n,))
    assert own_redis.queued("celery") == 51
    sent = 0
    while events.get_message(timeout=1.0) is not None:
        sent += 1
    assert sent >= 50  # the task-sent events (and the subscription's confirmation)
    if kept:
        assert len(built) == 0  # the channel's client, kept since the first message
    else:
        assert len(built) >= 100  # kombu's own: one per message and one per event
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, Transport) == kept
        assert conn.as_uri().startswith("redis://")  # what Flower and the log read


def test_publishing_goes_on_after_the_broker_restarts(
    own_redis: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    _served_by(monkeypatch, REDIS_TRANSPORT)
    app = _app(own_redis.url)
    app.send_task("t.noop", (0,))
    own_redis.restart()  # nothing kept on disk: the queue is empty again
    for n in range(3):
        app.send_task("t.noop", (n,), retry=True)
    assert own_redis.queued("celery") == 3
