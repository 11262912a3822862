"""Quarantine settings for `run_proxy` and the dead-letter counts on /metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.harness.metrics import scrape, value
from tests.harness.proxy import RunningProxy


def journal_settings(directory: Path | str, **overrides: Any) -> dict[str, Any]:
    return {"dir": str(directory), "flush_interval_ms": 50, **overrides}


def dead_letter_counts(proxy: RunningProxy) -> tuple[float, float]:
    samples = scrape(proxy)
    return (
        value(samples, "kvproxy_dead_letters_total", result="written"),
        value(samples, "kvproxy_dead_letters_total", result="failed"),
    )
