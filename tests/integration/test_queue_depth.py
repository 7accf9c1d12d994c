"""The backlog guard's queue depth (`opledger.tasks.backlog.queue_depth`) on a real Redis:
read on one connection this process keeps (the sweep and the relay read it every cycle),
never one shared across a fork, and read again on a new one after the broker restarted."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import redis
from celery import Celery

from opledger.dev.processes import PrivateRedis
from opledger.tasks.backlog import queue_depth


def _app(url: str) -> Celery:
    app = Celery("depth-test", set_as_current=False)
    app.conf.broker_url = url
    return app


def _connections_made(url: str) -> int:
    """Connections the server has accepted since it started, less the one asking."""
    with redis.Redis.from_url(url) as admin:
        return int(admin.info("stats")["total_connections_received"]) - 1


def test_depth_is_read_on_one_kept_connection_and_again_after_a_restart(
    own_redis: PrivateRedis,
) -> None:
    sender, app = _app(own_redis.url), _app(own_redis.url)
    for n in range(3):
        sender.send_task("t.noop", (n,), queue="dispatch")
    assert queue_depth(app, "dispatch") == 3
    made = _connections_made(own_redis.url)
    for _ in range(20):
        assert queue_depth(app, "dispatch") == 3
        assert queue_depth(app, "no-such-queue") == 0  # nothing waiting, not an error
    # none made per read (each question about the count is one connection more)
    assert _connections_made(own_redis.url) == made + 1

    own_redis.restart()  # empty (it keeps nothing on disk): the kept connection is dead
    assert queue_depth(app, "dispatch") == 0  # read on a new connection, not None
    sender.send_task("t.noop", (9,), queue="dispatch")
    assert queue_depth(app, "dispatch") == 1

    pid = os.fork()
    if pid == 0:  # a forked child reads on a connection of its own
        code = 0 if queue_depth(app, "dispatch") == 1 else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert queue_depth(app, "dispatch") == 1  # the parent's still works

    made = _connections_made(own_redis.url)
    with ThreadPoolExecutor(1) as other:  # another thread reads on a channel of its own
        assert other.submit(queue_depth, app, "dispatch").result() == 1
    # a reader of its own (the transport's connection and its channel's), and the count's
    assert _connections_made(own_redis.url) == made + 3


def test_an_unreachable_broker_reads_as_unknown(own_redis: PrivateRedis) -> None:
    app = _app(own_redis.url)
    app.conf.broker_connection_timeout = 1
    assert queue_depth(app, "dispatch") == 0
    own_redis.kill()
    assert queue_depth(app, "dispatch") is None  # the guard is off for this cycle
