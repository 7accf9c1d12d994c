"""Every Celery setting opledger relies on, read from the `OPLEDGER_` environment.

Why each one (docs/celery.md and docs/architecture.md say more):
- acks late + prefetch 1: a message is acknowledged only after its task ran, and a worker
  holds one at a time (one per queue on quorum queues, which have no global prefetch); a
  killed child leaves its row `dispatching` (reject_on_worker_lost stays False: the
  sweeper, not a redelivery, decides what happens next).
- the Redis visibility timeout is set identically in the three places Celery reads it, far
  above the task time limit, and no task uses a countdown near it;
- only JSON; no results; task events on so Flower sees every task.
"""

from __future__ import annotations

from opledger.queues import keep_one_client_per_channel, queues_of
from opledger.settings import DEFAULT_BROKER_URL, UNCONFIGURED_BROKER_URL, get_settings
from opledger.tasks import wiring
from opledger.tasks.wiring import GUARANTEES

_settings = get_settings()

# Unset: no broker. Publishing a task then raises NotConfigured (tasks.app.OperationTask)
# and `opledger worker`, `beat` and `flower` refuse to start, naming the variable; only in
# development mode (OPLEDGER_DEV=1) does it mean the local Redis. Importing this module
# never connects to or starts anything.
broker_url = _settings.broker_url or (
    DEFAULT_BROKER_URL if _settings.dev else UNCONFIGURED_BROKER_URL
)
broker_connection_retry_on_startup = True
# kombu's Redis channels keep one Redis client each, not one per message and event
# (opledger.redis_transport)
keep_one_client_per_channel()

# The settings opledger's guarantees rest on (`tasks.wiring.GUARANTEES`, which says why
# each; `register(app)` refuses an app that differs in one).
task_serializer = GUARANTEES["task_serializer"].value
result_serializer = "json"
accept_content = ["json"]
event_serializer = "json"
task_ignore_result = True
result_backend = None

task_acks_late = GUARANTEES["task_acks_late"].value
# A channel error (RabbitMQ closing a channel for consumer_timeout, PRECONDITION_FAILED)
# restarts the consumer instead of ending the worker with "Unrecoverable error"; the
# delivery goes back to the queue and the fence refuses its second claim.
broker_channel_error_retry = True
task_reject_on_worker_lost = GUARANTEES["task_reject_on_worker_lost"].value
worker_prefetch_multiplier = GUARANTEES["worker_prefetch_multiplier"].value
worker_cancel_long_running_tasks_on_connection_loss = True
task_time_limit = _settings.task_time_limit_seconds
task_soft_time_limit = max(1, _settings.task_time_limit_seconds - 10)

visibility_timeout = _settings.visibility_timeout_seconds
broker_transport_options = {"visibility_timeout": visibility_timeout}
result_backend_transport_options = {"visibility_timeout": visibility_timeout}

worker_send_task_events = True
task_send_sent_event = True
worker_hijack_root_logger = False
worker_concurrency = _settings.worker_concurrency

# opledger's four queues (opledger.queues), each with its own exchange; on RabbitMQ quorum
# queues behind topic exchanges if OPLEDGER_RABBITMQ_QUEUE_TYPE=quorum
task_queues = queues_of(_settings.rabbitmq_queue_type, broker_url)
task_default_exchange = "dispatch"
task_default_routing_key = "dispatch"
task_default_queue = "dispatch"
# opledger's routes, beat entries and scheduler: `tasks.wiring`, which `register(app)` reads
# too. The scheduler is Celery's persistent one, except that a broker refusing the
# connection (RabbitMQ while it recovers or re-creates a virtual host) no longer ends the
# beat process (`opledger.tasks.beat`).
task_routes = wiring.task_routes()
beat_scheduler = wiring.SCHEDULER
beat_schedule = wiring.beat_schedule(_settings.sweep_interval_seconds)
