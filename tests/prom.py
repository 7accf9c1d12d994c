"""Prometheus's text format read back into samples."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
