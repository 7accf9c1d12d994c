"""opledger's tasks on a Celery app of your own: `register(app)`.

opledger's tasks are shared tasks, so any finalized app has them; what an app of yours
does not have is opledger's queues, routes and beat entries, nor the settings opledger's
guarantees rest on. `register(app)` adds the first and checks the second, refusing an app
that would break a guarantee with one line naming the setting (`AppMisconfigured`):

- `task_acks_late=True` and `worker_prefetch_multiplier=1`: a message is acknowledged only
  after its task ran, and a worker process holds one at a time;
- `task_reject_on_worker_lost` off: a killed worker leaves its row `dispatching` and the
  sweeper, not a blind redelivery, decides what happens next;
- a hard `task_time_limit` below the broker's redelivery horizon: on Redis the visibility
  timeout (`broker_transport_options["visibility_timeout"]`, kombu's default 3600 s when
  unset); on RabbitMQ the server's `consumer_timeout` (RabbitMQ's default 30 min; tell
  opledger another value with `OPLEDGER_BROKER_CONSUMER_TIMEOUT_SECONDS`);
- JSON only (`task_serializer`, `accept_content`): the messages carry only operation ids.

Nothing here connects to a broker or a database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from kombu.entity import Exchange, Queue

from opledger.queues import is_amqp, keep_one_client_per_channel, queues_of
from opledger.settings import NotConfigured, get_settings

from . import beatwatch
from .wiring import GUARANTEES, SCHEDULER, beat_schedule, task_routes

#: kombu's Redis visibility timeout when none is configured
REDIS_DEFAULT_VISIBILITY_S = 3600
REDIS_SCHEMES = ("redis", "rediss", "sentinel")


class AppMisconfigured(NotConfigured):
    """A Celery app's setting breaks one of opledger's guarantees; the message names it."""


def _conf(app: Any, name: str) -> Any:
    return app.conf.get(name)


def chosen(app: Any, name: str) -> bool:
    """Whether `app` was given `name` (by `conf.update`, an attribute, `config_from_object`
    or the environment), not merely left at Celery's default."""
    conf = app.conf
    conf.broker_url  # noqa: B018 - reading a setting finalizes the layers below
    return any(name in layer for layer in conf.maps[:-1])  # the last layer: the defaults


def _broker_url(app: Any) -> str | None:
    """The app's broker, as Celery resolves it (`CELERY_BROKER_URL` included)."""
    return app.conf.broker_url  # type: ignore[no-any-return]


def broker_scheme(url: str | None) -> str:
    return urlsplit(url or "").scheme


def check_app(app: Any) -> None:
    """Raise `AppMisconfigured`, naming the first setting of `app` opledger cannot run on."""
    for name, guarantee in GUARANTEES.items():
        got = _conf(app, name)
        if not guarantee.accepts(got):
            raise AppMisconfigured(
                f"Celery setting {name} must be {guarantee.wanted} for opledger's tasks "
                f"(got {got!r}): {guarantee.why}"
            )
    accept = _conf(app, "accept_content")
    if not accept or set(accept) - {"json", "application/json"}:
        raise AppMisconfigured(
            f"Celery setting accept_content must be ['json'] (got {accept!r}): opledger's "
            "workers accept JSON only"
        )
    limit = _conf(app, "task_time_limit")
    if not limit or limit <= 0:
        raise AppMisconfigured(
            "Celery setting task_time_limit must be set: opledger needs a hard time limit "
            "below the broker's redelivery horizon"
        )
    scheme = broker_scheme(_broker_url(app))
    if scheme in REDIS_SCHEMES:
        options = _conf(app, "broker_transport_options") or {}
        visibility = options.get("visibility_timeout", REDIS_DEFAULT_VISIBILITY_S)
        if visibility <= limit:
            raise AppMisconfigured(
                f"Celery setting broker_transport_options['visibility_timeout'] ({visibility}) "
                f"must exceed task_time_limit ({limit}): Redis would redeliver a running task"
            )
    elif is_amqp(_broker_url(app)):
        consumer = get_settings().broker_consumer_timeout_seconds
        if consumer <= limit:
            raise AppMisconfigured(
                f"RabbitMQ consumer_timeout (OPLEDGER_BROKER_CONSUMER_TIMEOUT_SECONDS={consumer:g})"
                f" must exceed Celery setting task_time_limit ({limit}): RabbitMQ would close "
                "the channel of a running task"
            )


def opledger_queues(app: Any) -> tuple[Queue, ...]:
    """opledger's queues for `app`'s broker (as in celeryconfig): quorum queues on RabbitMQ
    when `OPLEDGER_RABBITMQ_QUEUE_TYPE=quorum`."""
    return queues_of(get_settings().rabbitmq_queue_type, _broker_url(app))


def _queues(app: Any) -> list[Queue]:
    existing = _conf(app, "task_queues")
    if existing is None:  # Celery's implicit default queue must keep being consumed
        name = _conf(app, "task_default_queue") or "celery"
        exchange = _conf(app, "task_default_exchange") or name
        key = _conf(app, "task_default_routing_key") or name
        existing = [Queue(name, Exchange(exchange, type="direct"), routing_key=key)]
    queues = list(existing)
    names = {q.name for q in queues}
    queues += [q for q in opledger_queues(app) if q.name not in names]
    return queues


def _routes(app: Any) -> Any:
    ours = task_routes()
    existing = _conf(app, "task_routes")
    if existing is None:
        return ours
    if isinstance(existing, Mapping):
        return {**dict(existing), **ours}
    if isinstance(existing, Sequence) and not isinstance(existing, str):
        return [ours, *existing]  # the first router that answers wins: ours, for our tasks
    return [ours, existing]  # a single router function


def register(app: Any) -> Any:
    """Put opledger's queues, routes and beat entries on `app` after checking its settings.

    Two of Celery's defaults change unless the app chose a value itself (in any way: an
    attribute, `conf.update`, `config_from_object`): beat gets opledger's scheduler
    (`opledger.tasks.beat:Scheduler`, which waits out a broker refusing its first
    connection, and keeps its schedule file in opledger's state directory unless the app
    chose `beat_schedule_filename` or beat is given `-s`) and `broker_channel_error_retry`
    is turned on (a channel error restarts
    the worker's consumer instead of ending the worker). Its workers watch the beat's
    heartbeat (`opledger.tasks.beatwatch`). kombu's Redis channels keep one
    Redis client each from then on, in the whole process (`opledger.redis_transport`).

    Returns `app`. Call it where you configure your app, before its worker or beat starts.
    Raises `AppMisconfigured` (one line naming the setting) when the app would break one of
    opledger's guarantees; nothing is changed then."""
    check_app(app)
    import opledger.tasks.app  # the shared tasks attach to every app, yours too

    app.conf.task_queues = _queues(app)
    app.conf.task_routes = _routes(app)
    ours = beat_schedule(get_settings().sweep_interval_seconds, prefix="opledger-")
    app.conf.beat_schedule = {**(_conf(app, "beat_schedule") or {}), **ours}
    if not chosen(app, "broker_channel_error_retry"):
        # Celery's default ends the worker on a channel error (RabbitMQ's consumer_timeout);
        # an explicit choice of yours is kept.
        app.conf.broker_channel_error_retry = True
    if not chosen(app, "beat_scheduler"):
        # Celery's own scheduler exits on the first broker refusal; ours waits it out.
        # A scheduler of your own choosing (django-celery-beat, ...) is left as it is.
        app.conf.beat_scheduler = SCHEDULER
    # Importing opledger's module created its own app; yours stays the current one (in
    # this thread, as Celery's current app is per thread), so `dispatch.delay(op_id)`
    # publishes through your app here, and opledger's own publishers (`publish_dispatch`,
    # the agent API, the outbox) use it from any thread.
    app.set_current()
    opledger.tasks.app.use_for_publishing(app)
    beatwatch.install(app)  # its workers log a missing beat once, as opledger's own do
    keep_one_client_per_channel()
    return app


__all__ = ["AppMisconfigured", "check_app", "register"]
