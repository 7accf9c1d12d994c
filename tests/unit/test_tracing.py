"""Traces are off unless configured: with no OTEL_* asking for them, or without the
`[tracing]` extra, no tracer provider is set, no Celery signal is connected, nothing
imports opentelemetry, and every span is one shared no-op object.

The off paths run in fresh processes: this one may have imported opentelemetry already."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from opledger.observability import tracing

# Starts the way a worker or beat does (Celery imports its task modules: opledger's tasks
# then call `tracing.install()`) and walks a worker's spans.
WORKER_PATH = """
import json, sys
from celery import signals
import opledger.tasks.app
signals.import_modules.send(sender=opledger.tasks.app.app)
from opledger.observability import tracing

mine = lambda signal: [r for _, r in signal.receivers
                       if getattr(r, "__module__", "") == "opledger.observability.tracing"]
spans = [tracing.prepare("acme", "crm.close_case.v1"), tracing.claim("op_x"),
         tracing.decide("op_x"), tracing.outcome("op_x", 1, "provider")]
for span in spans:
    with span as s:
        s.set("opledger.fence", 1); s.fenced(); s.prepared(None); s.outcome(None)
print(json.dumps({
    "noop": all(s is tracing.NOOP for s in spans),
    "traceparent": tracing.traceparent(),
    "enabled": tracing.enabled(),
    "configure": tracing.configure(),
    "connected": len(mine(signals.worker_process_init)) + len(mine(signals.beat_init)),
    "imported": sorted({m.split(".")[0] for m in sys.modules if m.startswith("opentelemetry")}),
}))
"""

# Makes the extra look missing: nothing named opentelemetry can be imported.
NO_EXTRA = """
import importlib.abc, sys
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Missing())
"""


def _run(code: str, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OPLEDGER_"))}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    result["stderr"] = done.stderr
    return result


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, True),
        # other OTEL_ settings (a service name, a sampler) ask for nothing by themselves
        ({"OTEL_SERVICE_NAME": "opledger", "OTEL_TRACES_SAMPLER": "always_on"}, False),
    ],
)
def test_the_standard_environment_decides_whether_traces_are_wanted(
    env: dict[str, str], wanted: bool
) -> None:
    assert tracing.wanted(env) is wanted


def test_unconfigured_nothing_is_set_up_and_every_span_is_the_shared_noop() -> None:
    result = _run(WORKER_PATH)
    assert result["noop"] is True and result["traceparent"] is None
    assert result["enabled"] is False and result["configure"] is False
    assert result["connected"] == 0  # no worker or beat signal handler
    assert result["imported"] == []  # opentelemetry never imported


def test_configured_without_the_extra_warns_and_stays_off() -> None:
    result = _run(NO_EXTRA + WORKER_PATH, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    assert result["noop"] is True and result["enabled"] is False
    assert result["configure"] is False and result["connected"] == 0
    assert result["imported"] == []
    assert "pip install 'opledger[tracing]'" in str(result["stderr"])


def test_configured_the_worker_signals_are_connected_and_configure_sets_a_provider() -> None:
    code = WORKER_PATH.replace(
        '"imported":',
        '"provider": type(__import__("opentelemetry.trace").trace.get_tracer_provider())'
        ".__name__, "
        '"after": [type(s).__name__ for s in (tracing.claim("op_x"),)], "imported":',
    )
    result = _run(code, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="t")
    assert result["connected"] == 2  # worker_process_init and beat_init
    assert result["configure"] is True and result["provider"] == "TracerProvider"
    assert result["after"] == ["_Span"]


def test_the_noop_span_costs_no_allocation() -> None:
    assert not tracing.enabled()
    assert tracing.claim("op_x") is tracing.NOOP
    assert tracing.provider_call(object()) is tracing.NOOP
    assert tracing.lookup(object()) is tracing.NOOP
    assert tracing.traceparent() is None
