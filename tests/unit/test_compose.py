"""docker-compose.yml cannot run here (no Docker engine), so check what can be checked:
its settings exist, its commands exist, its invariants hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from opledger.cli.main import app
from opledger.settings import Settings

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def _commands() -> set[str]:
    return {c.name or c.callback.__name__ for c in app.registered_commands}  # type: ignore[union-attr]


def test_every_service_is_there_with_a_healthcheck_where_it_matters() -> None:
    services = _compose()["services"]
    assert {"postgres", "redis", "migrate", "worker", "beat", "flower", "sandbox"} <= set(services)
    for name in ("postgres", "redis", "worker", "flower", "sandbox"):
        assert "healthcheck" in services[name], name


#: OpenTelemetry's own variables the compose file passes through (opledger.observability.tracing)
OTEL = {"OTEL_EXPORTER_OTLP_ENDPOINT"}


def test_opledger_services_run_real_commands_with_real_settings() -> None:
    services = _compose()["services"]
    fields = {name.upper() for name in Settings.model_fields}
    for name in ("migrate", "worker", "beat", "flower", "sandbox"):
        service = services[name]
        assert service["command"][0] in _commands(), name
        for variable, value in service.get("environment", {}).items():
            if variable in OTEL:  # the standard OpenTelemetry variable: off unless given
                assert value == f"${{{variable}:-}}", variable
                continue
            assert variable.startswith("OPLEDGER_") and variable[9:] in fields, variable


def test_exactly_one_beat_and_the_order_of_start() -> None:
    services = _compose()["services"]
    assert services["beat"]["deploy"]["replicas"] == 1
    assert services["migrate"]["restart"] == "no"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("worker", "beat", "flower"):
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully"
        assert deps["redis"]["condition"] == "service_healthy"


def test_flower_is_never_open_without_a_password() -> None:
    flower = _compose()["services"]["flower"]
    assert ":?" in flower["environment"]["OPLEDGER_FLOWER_PASSWORD"]
    assert all(port.startswith("127.0.0.1:") for port in flower["ports"])


DEPLOY = COMPOSE.parent / "deploy"
OBSERVABILITY = COMPOSE.parent / "opledger" / "observability"


def _exported() -> set[str]:
    """Every metric name opledger exports (workers' counters, the ledger's gauges)."""
    import re

    names: set[str] = set()
    for module in ("metrics.py", "ledger_gauges.py"):
        source = (OBSERVABILITY / module).read_text()
        names |= set(re.findall(r'"(opledger_[a-z_]+)"', source))
        names |= {f"opledger_oldest_{s}_age_seconds" for s in ("prepared", "unknown")}
    return names


def _used(text: str) -> set[str]:
    import re

    found = set(re.findall(r"\b(opledger_[a-z_]+)", text))
    suffixes = ("_total", "_bucket", "_count", "_sum")
    return {next((n.removesuffix(s) for s in suffixes if n.endswith(s)), n) for n in found}


def test_the_observability_profile_is_optional_and_never_open() -> None:
    services = _compose()["services"]
    for name in ("metrics", "prometheus", "grafana", "jaeger"):
        assert services[name]["profiles"] == ["observability"], name
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"]), name
    metrics = services["metrics"]
    assert metrics["command"][0] in _commands()
    assert ":?" in metrics["environment"]["OPLEDGER_FLOWER_PASSWORD"]
    for service in ("prometheus", "grafana"):
        for volume in services[service]["volumes"]:
            assert (COMPOSE.parent / volume.split(":")[0]).exists(), volume


def test_alerts_and_dashboard_use_only_metrics_opledger_exports() -> None:
    import json

    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert {
        "OpledgerUnknownTooOld",
        "OpledgerReviewBacklogGrowing",
        "OpledgerNothingConfirmed",
        "OpledgerBeatLockLost",
        "OpledgerBeatMissing",
    } <= names
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "opledger.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = _used("\n".join(exprs))
    assert used and used <= _exported(), used - _exported()
