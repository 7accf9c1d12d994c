"""Beat's schedule file goes to opledger's state directory, not the directory beat was
started from: for opledger's own app and for an app of the user's own with `register(app)`,
unless the app chose `beat_schedule_filename` or beat was given `-s`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from celery.beat import Service

import opledger.tasks
import opledger.tasks.app as tasks
from tests.userapps import their_app


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    cwd, state = tmp_path / "cwd", tmp_path / "state" / "beat"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("OPLEDGER_STATE_DIR", str(state))
    return cwd, state


@pytest.fixture
def theirs() -> Iterator[Celery]:
    with their_app() as app:
        yield app


def opened(app: Celery, schedule: str | None = None) -> Path:
    """The file beat's scheduler keeps its schedule in, as `celery beat [-s schedule]`
    makes it (its service, with `-s` or the app's setting, and the app's scheduler), opened
    and closed again."""
    service = Service(app, schedule_filename=schedule, scheduler_cls=app.conf.beat_scheduler)
    scheduler = service.get_scheduler()
    try:
        return Path(scheduler.schedule_filename)
    finally:
        scheduler.close()


def written(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_opledgers_app_keeps_its_schedule_in_the_state_directory(
    dirs: tuple[Path, Path],
) -> None:
    cwd, state = dirs
    assert opened(tasks.app) == state.resolve() / "celerybeat-schedule"
    assert written(cwd) == []
    assert written(state) and all(n.startswith("celerybeat-schedule") for n in written(state))


def test_a_registered_app_keeps_it_there_unless_it_or_beat_names_one(
    dirs: tuple[Path, Path], theirs: Celery, tmp_path: Path
) -> None:
    cwd, state = dirs
    opledger.tasks.register(theirs)
    assert opened(theirs) == state.resolve() / "celerybeat-schedule"
    given = tmp_path / "given" / "schedule"
    given.parent.mkdir()
    assert opened(theirs, str(given)) == given  # `celery beat -s PATH`
    theirs.conf.beat_schedule_filename = "their-schedule"  # relative: theirs to choose
    assert opened(theirs) == Path("their-schedule")
    assert [n for n in written(cwd) if n.startswith("their-schedule")]
    assert not [n for n in written(cwd) if n.startswith("celerybeat-schedule")]


def test_a_state_directory_that_cannot_be_made_leaves_it_in_the_working_directory(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cwd, _ = dirs
    monkeypatch.setenv("OPLEDGER_STATE_DIR", "/proc/opledger-cannot-make-this")
    assert opened(tasks.app) == Path("celerybeat-schedule")
    assert "cannot create the state directory /proc/opledger-cannot-make-this" in caplog.text
    assert written(cwd)
