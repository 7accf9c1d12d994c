"""`opledger.tasks.register(app)`: opledger's queues, routes and beat entries on an app of
the user's own, after checking the settings opledger's guarantees rest on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, current_app

import opledger.tasks
import opledger.tasks.app as tasks
from opledger.cli.failures import OPERATIONAL, describe
from opledger.settings import get_settings
from opledger.tasks import AppMisconfigured
from opledger.tasks.beatwatch import BeatWatchStep
from opledger.tasks.integrate import check_app
from tests.userapps import GOOD, their_app


@pytest.fixture
def theirs() -> Iterator[Celery]:
    with their_app() as app:
        yield app


def test_a_well_configured_app_gets_queues_routes_beat_and_tasks(theirs: Celery) -> None:
    theirs.conf.beat_schedule = {"their-report": {"task": "theirs.report", "schedule": 60.0}}

    @theirs.task(name="theirs.report", shared=False)
    def report() -> None: ...

    assert opledger.tasks.register(theirs) is theirs
    names = [q.name for q in theirs.conf.task_queues]
    assert names == ["celery", "dispatch", "reconcile", "maintenance", "notifications"]
    assert tasks.queue_of("opledger.dispatch", theirs) == "dispatch"
    assert tasks.queue_of("opledger.sweep", theirs) == "maintenance"
    assert tasks.queue_of("theirs.report", theirs) == "celery"
    assert set(theirs.conf.beat_schedule) == {
        "their-report",
        "opledger-sweep",
        "opledger-relay",
        "opledger-purge-payloads",
    }
    assert theirs.conf.beat_schedule["opledger-sweep"]["task"] == "opledger.sweep"
    assert {"opledger.dispatch", "opledger.relay", "theirs.report"} <= set(theirs.tasks)
    assert current_app._get_current_object() is theirs  # dispatch.delay publishes through it
    assert BeatWatchStep in theirs.steps["worker"]  # its workers say when beat is missing


def test_celerys_defaults_for_beat_and_channel_errors_become_ours_and_choices_are_kept(
    theirs: Celery,
) -> None:
    opledger.tasks.register(theirs)
    assert theirs.conf.beat_scheduler == "opledger.tasks.beat:Scheduler"
    assert theirs.conf.broker_channel_error_retry is True
    chosen = Celery("chosen", set_as_current=False)
    chosen.conf.update(
        GOOD,
        beat_scheduler="django_celery_beat.schedulers:DatabaseScheduler",
        broker_channel_error_retry=False,
    )
    opledger.tasks.register(chosen)
    assert chosen.conf.beat_scheduler == "django_celery_beat.schedulers:DatabaseScheduler"
    assert chosen.conf.broker_channel_error_retry is False
    # chosen in a configuration object (the usual way), even where it equals the default
    from_object = Celery("from-object", set_as_current=False)
    from_object.config_from_object(
        {
            **GOOD,
            "beat_scheduler": "celery.beat:PersistentScheduler",
            "broker_channel_error_retry": False,
        }
    )
    opledger.tasks.register(from_object)
    assert from_object.conf.beat_scheduler == "celery.beat:PersistentScheduler"
    assert from_object.conf.broker_channel_error_retry is False


def test_quorum_queues_follow_the_setting_on_their_rabbitmq_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPLEDGER_RABBITMQ_QUEUE_TYPE", "quorum")
    get_settings.cache_clear()
    try:
        rabbit = Celery(
            "rabbit", broker="amqp://guest:guest@127.0.0.1:5672//", set_as_current=False
        )
        rabbit.conf.update(GOOD)
        opledger.tasks.register(rabbit)
        ours = {q.name: q for q in rabbit.conf.task_queues if q.name != "celery"}
        assert sorted(ours) == ["dispatch", "maintenance", "notifications", "reconcile"]
        assert all(q.queue_arguments == {"x-queue-type": "quorum"} for q in ours.values())
        assert {q.exchange.type for q in ours.values()} == {"topic"}
    finally:
        get_settings.cache_clear()
        tasks.app.set_current()


def test_their_routers_are_kept_behind_ours(theirs: Celery) -> None:
    def router(name: str, *_: Any, **__: Any) -> dict[str, str] | None:
        return {"queue": "reports"} if name.startswith("theirs.") else None

    theirs.conf.task_routes = (router,)
    theirs.conf.task_queues = [*Celery(set_as_current=False).amqp.queues.values()]
    opledger.tasks.register(theirs)
    assert tasks.queue_of("opledger.reconcile", theirs) == "reconcile"
    assert theirs.amqp.router.route({}, "theirs.x")["queue"].name == "reports"
    assert theirs.amqp.router.route({}, "opledger.dispatch")["queue"].name == "dispatch"


@pytest.mark.parametrize(
    ("setting", "value", "named"),
    [
        ("task_acks_late", False, "task_acks_late"),
        ("worker_prefetch_multiplier", 4, "worker_prefetch_multiplier"),
        ("task_reject_on_worker_lost", True, "task_reject_on_worker_lost"),
        ("task_serializer", "pickle", "task_serializer"),
        ("accept_content", ["json", "pickle"], "accept_content"),
        ("task_time_limit", None, "task_time_limit"),
        ("broker_transport_options", {"visibility_timeout": 30}, "visibility_timeout"),
        ("broker_transport_options", {}, "visibility_timeout"),  # kombu's 3600 s default
    ],
)
def test_a_setting_that_breaks_a_guarantee_is_refused_in_one_line_naming_it(
    theirs: Celery, setting: str, value: Any, named: str
) -> None:
    theirs.conf[setting] = value
    if named == "visibility_timeout" and not value:
        theirs.conf.task_time_limit = 4000
    with pytest.raises(AppMisconfigured, match=named) as refused:
        opledger.tasks.register(theirs)
    assert describe(refused.value) == (OPERATIONAL, str(refused.value))
    assert "\n" not in str(refused.value)
    assert theirs.conf.task_queues is None  # nothing changed


def test_on_rabbitmq_the_consumer_timeout_must_exceed_the_time_limit(
    theirs: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs.conf.broker_url = "amqp://guest:guest@127.0.0.1:5672//"
    theirs.conf.broker_transport_options = {}
    check_app(theirs)  # RabbitMQ's default 30 min is above 60 s
    monkeypatch.setenv("OPLEDGER_BROKER_CONSUMER_TIMEOUT_SECONDS", "30")
    get_settings.cache_clear()
    try:
        with pytest.raises(AppMisconfigured, match="OPLEDGER_BROKER_CONSUMER_TIMEOUT_SECONDS"):
            check_app(theirs)
    finally:
        get_settings.cache_clear()


def test_opledgers_own_app_passes_its_own_checks() -> None:
    check_app(tasks.app)


def test_celerys_own_defaults_that_keep_a_guarantee_are_accepted(theirs: Celery) -> None:
    """`task_reject_on_worker_lost` left at Celery's default (None) is off, as required."""
    theirs.conf.task_reject_on_worker_lost = None
    opledger.tasks.register(theirs)
    assert theirs.conf.task_queues is not None


def test_the_wiring_names_beats_scheduler_and_routes_each_entry_beat_sends() -> None:
    """`tasks.wiring` is data: the scheduler it names is beat's, every entry's task has a
    route, and Celery reads its seconds as the schedule it means."""
    from celery.beat import ScheduleEntry
    from celery.utils.imports import symbol_by_name

    from opledger.tasks import beat, wiring

    assert symbol_by_name(wiring.SCHEDULER) is beat.Scheduler
    schedule = wiring.beat_schedule(15.0, prefix="opledger-")
    assert set(schedule) == {"opledger-sweep", "opledger-relay", "opledger-purge-payloads"}
    assert {e["task"] for e in schedule.values()} <= set(wiring.ROUTES)
    sweep = ScheduleEntry(name="opledger-sweep", app=tasks.app, **schedule["opledger-sweep"])
    assert sweep.schedule.run_every.total_seconds() == 15.0
    assert schedule["opledger-purge-payloads"]["options"] == {"expires": 3600.0}
