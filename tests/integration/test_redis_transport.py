"""opledger's Redis transport on a real Redis: every message and event reaches the broker
as with kombu's own, over one Redis client per channel (kombu's builds one per message),
and publishing goes on across a broker restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from opledger.dev.processes import PrivateRedis
from opledger.redis_transport import TRANSPORT, transport_for


def test_the_transport_is_chosen_for_redis_urls_only() -> None:
    assert transport_for("redis://127.0.0.1:6379/0") == TRANSPORT
    assert transport_for("rediss://cache.example:6380/1") == TRANSPORT
    assert transport_for("amqp://guest@localhost//") is None
    assert transport_for("sentinel://127.0.0.1:26379") is None
    assert transport_for(None) is None


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()


def _app(url: str, transport: str | None) -> Celery:
    app = Celery("transport-test", set_as_current=False)
    app.conf.broker_url = url
    app.conf.broker_transport = transport
    app.conf.task_send_sent_event = True  # an event per message: the fanout publish too
    return app


@pytest.mark.parametrize("transport", [TRANSPORT, None])
def test_messages_and_events_reach_redis_over_one_client(
    broker: PrivateRedis, transport: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[int] = []
    init = redis.Redis.__init__

    def counted(self: redis.Redis, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        init(self, *args, **kwargs)

    app = _app(broker.url, transport)
    app.send_task("t.noop", (0,))  # the connection and its channel set up
    events = redis.Redis.from_url(broker.url).pubsub()  # type: ignore[no-untyped-call]
    events.psubscribe("*celeryev*")
    monkeypatch.setattr(redis.Redis, "__init__", counted)
    for n in range(50):
        app.send_task("t.noop", (n,))
    monkeypatch.undo()
    assert broker.queued("celery") == 51
    sent = 0
    while events.get_message(timeout=1.0) is not None:
        sent += 1
    assert sent >= 50  # the task-sent events (and the subscription's confirmation)
    if transport == TRANSPORT:
        assert len(built) == 0  # the channel's client, kept since the first message
    else:
        assert len(built) >= 100  # kombu's own: one per message and one per event


def test_publishing_goes_on_after_the_broker_restarts(broker: PrivateRedis) -> None:
    app = _app(broker.url, TRANSPORT)
    app.send_task("t.noop", (0,))
    broker.restart()  # nothing kept on disk: the queue is empty again
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=5)
    for n in range(3):
        app.send_task("t.noop", (n,), retry=True)
    assert broker.queued("celery") == 3
