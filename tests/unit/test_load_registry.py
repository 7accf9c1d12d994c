"""`OPLEDGER_ADAPTERS` is checked when the registry is loaded: each mistake is one line that
names the setting and what is wrong, never a traceback and never a silent default."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from opledger.adapters.registry import AdaptersInvalid, Registry, load_registry
from opledger.cli.main import app
from opledger.ledger.contract import Limits
from opledger.settings import (
    NotConfigured,
    ProviderLimits,
    Settings,
    SettingsInvalid,
    get_settings,
)

FACTORY = """
from opledger.adapters.registry import Registry

def build(settings):
    return Registry()
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """Write a module of a fresh name with the given source; its name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(source: str) -> str:
        name = f"adapters_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(source)
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


def _refused(spec: str) -> AdaptersInvalid:
    with pytest.raises(AdaptersInvalid) as caught:
        load_registry(Settings.from_environ({"OPLEDGER_ADAPTERS": spec}))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"OPLEDGER_ADAPTERS={spec!r}"), message
    assert isinstance(caught.value, NotConfigured)  # the CLI prints it as a setting error
    return caught.value


def test_a_factory_that_builds_a_registry_is_loaded(module: Callable[[str], str]) -> None:
    name = module(FACTORY)
    registry = load_registry(Settings.from_environ({"OPLEDGER_ADAPTERS": f"{name}:build"}))
    assert isinstance(registry, Registry)


def test_no_function_part_is_refused_not_defaulted(module: Callable[[str], str]) -> None:
    # the module has a build_registry: the value must still name it
    name = module(FACTORY + "\nbuild_registry = build\n")
    assert "names no function: the form is module:function" in str(_refused(name))
    assert "names no function" in str(_refused(""))


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("my app:build", "'my app' is not a module name"),
        ("myapp:", "'' is not a function name"),
        ("myapp:build()", "'build()' is not a function name"),
    ],
)
def test_a_value_that_is_no_module_path_is_refused(spec: str, said: str) -> None:
    assert said in str(_refused(spec))


def test_a_module_that_is_not_there_says_which_and_where_to_look() -> None:
    error = str(_refused("nosuch_adapters_module.tickets:build"))
    assert "cannot import nosuch_adapters_module.tickets: No module named" in error
    assert "PYTHONPATH" in error


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("import nosuch_dependency_x\n", "ModuleNotFoundError: No module named 'nosuch_dep"),
        ("def broken(:\n", "SyntaxError: "),
        ("raise RuntimeError('first line\\nsecond line')\n", "RuntimeError: first line"),
    ],
    ids=["missing-dependency", "syntax-error", "import-time-error"],
)
def test_a_module_that_fails_to_import_says_which_and_the_first_line(
    module: Callable[[str], str], source: str, said: str
) -> None:
    name = module(source)
    error = _refused(f"{name}:build")
    assert f"importing {name} failed: {said}" in str(error)
    assert "second line" not in str(error)
    assert error.__cause__ is not None  # `--debug` shows the traceback


@pytest.mark.parametrize(
    ("source", "attribute", "said"),
    [
        (FACTORY, "missing", "defines no 'missing'"),
        ("class Build:\n    def __init__(self, settings): pass\n", "Build", "is a class"),
        ("from opledger.adapters.registry import Registry\n", "Registry", "is a class"),
        ("build = {'crm': 1}\n", "build", "is a dict, not a function"),
        ("def build():\n    pass\n", "build", "build() does not take one argument"),
        ("def build(settings, url):\n    pass\n", "build", "does not take one argument"),
    ],
    ids=["missing", "class", "registry-class", "not-callable", "no-argument", "two-arguments"],
)
def test_an_attribute_that_is_no_factory_is_refused(
    module: Callable[[str], str], source: str, attribute: str, said: str
) -> None:
    name = module(source)
    assert said in str(_refused(f"{name}:{attribute}"))


def test_a_factory_that_raises_is_named_with_the_first_line(module: Callable[[str], str]) -> None:
    name = module("def build(settings):\n    raise KeyError('TICKETS_URL')\n")
    error = _refused(f"{name}:build")
    assert f"{name}.build raised KeyError: 'TICKETS_URL'" in str(error)
    assert isinstance(error.__cause__, KeyError)


def test_a_factory_that_returns_no_registry_is_refused(module: Callable[[str], str]) -> None:
    name = module("def build(settings):\n    return []\n")
    assert f"{name}.build returned list, not a Registry" in str(_refused(f"{name}:build"))


def test_the_example_factory_says_what_it_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TICKETS_URL", raising=False)
    error = _refused("examples.adapter_tickets:build_registry")
    assert "raised ValueError: TICKETS_URL and TICKETS_TOKEN must both be set" in str(error)


def test_the_command_prints_one_line_and_exits_4(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPLEDGER_ADAPTERS", "opledger.adapters.registry:Registry")
    get_settings.cache_clear()
    try:
        run = CliRunner().invoke(app, ["contract", "check", "crm.close_case.v1"])
    finally:
        get_settings.cache_clear()
    assert run.exit_code == 4, run.output
    assert run.stderr.count("\n") == 1, run.stderr
    assert "OPLEDGER_ADAPTERS='opledger.adapters.registry:Registry'" in run.stderr
    assert "is a class" in run.stderr and "Traceback" not in run.output


def test_provider_limits_replace_the_contracts_and_a_typo_is_refused() -> None:
    limits = '{"crm": {"concurrency": 4, "rate": 20, "burst": 3, "probe_every_seconds": 1}}'
    registry = load_registry(Settings.from_environ({"OPLEDGER_PROVIDER_LIMITS": limits}))
    assert registry.limits_by_provider() == {
        "crm": {"concurrency": 4, "interval_s": 0.05, "burst": 3}
    }
    crm = registry.limits_for("crm")
    assert crm.probe_every.total_seconds() == 1 and crm.throttle_applies_nothing
    assert registry.limits_for("email").concurrency is None  # not named: as declared
    typo = '{"crm ": {"concurrency": 4}}'
    with pytest.raises(SettingsInvalid, match="names provider 'crm ', which no adapter"):
        load_registry(Settings.from_environ({"OPLEDGER_PROVIDER_LIMITS": typo}))


def test_provider_limits_keep_what_they_leave_out() -> None:
    declared = Limits(concurrency=2, rate=20, burst=5, throttle_applies_nothing=True)
    one_key = ProviderLimits.model_validate({"concurrency": 4}).apply(declared)
    assert one_key == declared.model_copy(update={"concurrency": 4})  # the burst stays 5
    waits = ProviderLimits.model_validate(
        {"retry_after_default_seconds": 30, "retry_after_max_seconds": 120, "probe_max_seconds": 9}
    ).apply(declared)
    assert waits.retry_after_default == timedelta(seconds=30)
    assert waits.retry_after_max == timedelta(seconds=120)
    assert waits.probe_max == timedelta(seconds=9) and waits.burst == 5
    with pytest.raises(ValidationError):
        ProviderLimits.model_validate({"retry_after_default": 30})  # the key names its unit
