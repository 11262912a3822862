"""Alternating runs, medians, the machine and the results files of the benchmarks.

Every benchmark compares kvproxy with a baseline measured in the same run (these machines are
noisy): it alternates the variants run by run and reports medians and ratios. Each one writes its
figures to `bench/results/<name>.json`; `bench.run_all` collects them into
`bench/results/latest.md`.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root (the benchmarks run from it, as `python -m bench.<name>`)."""
RESULTS = Path(os.environ.get("KVPROXY_BENCH_RESULTS", ROOT / "bench" / "results"))
"""Where figures go (`KVPROXY_BENCH_RESULTS` moves them, e.g. for the smoke test)."""


def alternate(
    rounds: int, variants: Mapping[str, Callable[[int], float]]
) -> dict[str, list[float]]:
    """Run every variant once per round, in turn (variant(round) -> figure); figures by name."""
    results: dict[str, list[float]] = {name: [] for name in variants}
    for round_index in range(rounds):
        for name, run in variants.items():
            figure = run(round_index)
            results[name].append(figure)
            print(f"  round {round_index + 1}/{rounds} {name}: {figure:,.2f}", flush=True)
    return results


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write_results(name: str, figures: Mapping[str, Any]) -> Path:
    """Save one benchmark's figures (with the machine) as bench/results/<name>.json."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **figures}, indent=2))
    print(f"figures written to {path}")
    return path


def report(result: dict[str, Any], json_path: Path | None) -> dict[str, Any]:
    """Print a benchmark's result as JSON, and write it to `json_path` when given."""
    print(json.dumps(result, indent=2), flush=True)
    if json_path:
        json_path.write_text(json.dumps(result, indent=2))
    return result
