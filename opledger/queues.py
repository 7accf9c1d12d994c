"""opledger's four queues, as every worker, beat and publisher declares them.

Each queue has its own exchange and routing key. (A Queue declared by name alone is bound
to the default exchange and key, and every message would reach every queue.) On RabbitMQ
they may be quorum queues (`OPLEDGER_RABBITMQ_QUEUE_TYPE=quorum`): their exchanges are
then topic exchanges, because Celery's native delayed delivery, which a countdown needs on
a quorum queue, routes only through topic and fanout exchanges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # kombu is imported when the queues are built, not by the CLI's checks
    from kombu.entity import Queue

QUEUES = ("dispatch", "reconcile", "maintenance", "notifications")
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
#: the broker URL schemes kombu serves with its Redis transport (not Sentinel), and the
#: transport opledger has serve them (`keep_one_client_per_channel`)
REDIS_SCHEMES = ("redis", "rediss")
REDIS_TRANSPORT = "opledger.redis_transport:Transport"


def keep_one_client_per_channel() -> None:
    """Have kombu serve Redis brokers with `opledger.redis_transport` from now on: one
    Redis client per channel instead of one per message and event (idempotent; imports
    nothing but kombu's table of transports)."""
    from kombu import transport

    for scheme in REDIS_SCHEMES:
        if transport.TRANSPORT_ALIASES.get(scheme) != REDIS_TRANSPORT:
            transport.TRANSPORT_ALIASES[scheme] = REDIS_TRANSPORT
            # a class kombu resolved for the name before (nothing in opledger's processes)
            getattr(transport, "_transport_cache", {}).pop(scheme, None)


def is_amqp(broker_url: str | None) -> bool:
    return (broker_url or "").split(":", 1)[0] in AMQP_SCHEMES


def queues_of(queue_type: str, broker_url: str | None) -> tuple[Queue, ...]:
    """The queues for `queue_type` ("classic" or "quorum") on the broker at `broker_url`:
    quorum only on RabbitMQ (Redis has one kind of queue)."""
    from kombu.entity import Exchange, Queue

    if queue_type == "quorum" and is_amqp(broker_url):
        return tuple(
            Queue(
                name,
                Exchange(name, type="topic"),
                routing_key=name,
                queue_arguments={"x-queue-type": "quorum"},
            )
            for name in QUEUES
        )
    return tuple(Queue(name, Exchange(name, type="direct"), routing_key=name) for name in QUEUES)
