"""The CLI's failure mapping: every ledger refusal is exit 3, every operational failure
exit 4, each said in one line that names what to fix and never shows a password; anything
else is a bug and is raised as it is."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

import kombu.exceptions
import pytest
import redis.exceptions
from pydantic import ValidationError
from sqlalchemy.exc import ArgumentError, OperationalError, ProgrammingError

from opledger import ledger
from opledger.cli.failures import OPERATIONAL, REFUSED, describe
from opledger.settings import NotConfigured, Settings, get_settings

OPERATIONAL_LEDGER_ERRORS = (ledger.DatabaseUnavailable, ledger.SchemaMissing)


E = TypeVar("E", bound=Exception)


def _subclasses(root: type[E]) -> set[type[E]]:
    found: set[type[E]] = set()
    todo = [root]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


LEDGER_ERRORS: list[type[Exception]] = sorted(
    {ledger.LedgerError} | _subclasses(ledger.LedgerError), key=lambda c: c.__name__
)


@pytest.fixture(autouse=True)
def configured(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("OPLEDGER_DATABASE_URL", "postgresql://ops:s3cret@db.internal:5433/ledger")
    monkeypatch.setenv("OPLEDGER_BROKER_URL", "redis://:hunter2@mq.internal:6380/0")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.mark.parametrize(
    "kind",
    LEDGER_ERRORS,
    ids=lambda c: c.__name__,
)
def test_each_ledger_error_maps_to_refused_or_operational(kind: type[Exception]) -> None:
    described = describe(kind("first line\nsecond line"))
    assert described is not None
    code, line = described
    operational = issubclass(kind, OPERATIONAL_LEDGER_ERRORS)
    assert code == (OPERATIONAL if operational else REFUSED)
    assert "\n" not in line and "first line second line" in line
    if operational:
        assert "OPLEDGER_DATABASE_URL=postgresql://ops:***@db.internal:5433/ledger" in line
    else:
        assert line.startswith("refused: ")


def _settings_error() -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        Settings(lease_seconds="soon")
    return caught.value


@pytest.mark.parametrize(
    ("exc", "names"),
    [
        (NotConfigured("OPLEDGER_DATABASE_URL is not set"), ["OPLEDGER_DATABASE_URL"]),
        (
            OperationalError("SELECT 1", {}, Exception("FATAL: password authentication failed\nx")),
            ["password authentication failed", "OPLEDGER_DATABASE_URL", "***"],
        ),
        (
            ProgrammingError("SELECT 1", {}, Exception("permission denied for table operations")),
            ["permission denied", "OPLEDGER_DATABASE_URL"],
        ),
        (ArgumentError("Could not parse SQLAlchemy URL"), ["OPLEDGER_DATABASE_URL", "parse"]),
        (
            kombu.exceptions.OperationalError("Error 111 connecting to mq.internal:6380."),
            ["broker", "OPLEDGER_BROKER_URL=redis://:***@mq.internal:6380/0", "Redis"],
        ),
        (redis.exceptions.ConnectionError("Connection refused"), ["OPLEDGER_BROKER_URL"]),
        (_settings_error(), ["OPLEDGER_LEASE_SECONDS"]),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else "",
)
def test_operational_failures_name_what_to_fix(exc: Exception, names: list[str]) -> None:
    described = describe(exc)
    assert described is not None
    code, line = described
    assert code == OPERATIONAL and "\n" not in line
    for name in names:
        assert name in line, (name, line)
    assert "s3cret" not in line and "hunter2" not in line


@pytest.mark.parametrize(
    "exc",
    [RuntimeError("bug"), KeyError("x"), TypeError("bad"), ValueError("plain"), BrokenPipeError()],
)
def test_anything_else_is_a_bug_raised_as_it_is(exc: Exception) -> None:
    assert describe(exc) is None
