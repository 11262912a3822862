"""bench/compare_commits.py: the before/after table is read from each run's figures.

The table is what "no loss" is judged by, so its medians, its B/A and its B - A for added
latencies (differences that can be negative, whose ratio means nothing) are checked here; running
the benchmarks themselves is left to the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import compare_commits as compare


def run(side: str, rnd: int, figures: dict[str, float], error: str = "") -> Any:
    """One latency run of `side` (a compare_commits.Run)."""
    return compare.Run(side, "latency", rnd, 1.0, 0.5, figures, error)


def test_medians_ratio_and_difference_per_figure() -> None:
    runs = [
        run("A", 1, {"paced: proxy p50 ms": 2.0, "paced: added p50 ms": 0.5}),
        run("B", 1, {"paced: proxy p50 ms": 3.0, "paced: added p50 ms": -0.25}),
        run("A", 2, {"paced: proxy p50 ms": 4.0, "paced: added p50 ms": 1.5}),
        run("B", 2, {"paced: proxy p50 ms": 5.0, "paced: added p50 ms": 0.25}),
    ]
    lines = compare.table(runs, ["latency"])
    assert (
        lines[2] == "| latency | paced: proxy p50 ms | 2.00 4.00 | 3.00 5.00 | 3.00 | 4.00 | 1.33 |"
    )
    assert lines[3].endswith("| 1.00 | 0.000 | B - A = -1.000 |")


def test_a_failed_run_is_shown_and_left_out_of_the_median() -> None:
    runs = [
        run("A", 1, {"paced: proxy p50 ms": 2.0}),
        run("B", 1, {}, error="exit 1"),
        run("A", 2, {"paced: proxy p50 ms": 2.0}),
        run("B", 2, {"paced: proxy p50 ms": 3.0}),
    ]
    assert compare.table(runs, ["latency"])[2] == (
        "| latency | paced: proxy p50 ms | 2.00 2.00 | x 3.00 | 2.00 | 3.00 | 1.50 |"
    )


def test_the_throughput_figures_come_from_its_summary() -> None:
    variant = {"median_mb_per_s": 50.0, "ratio_to_direct": 0.5, "median_proxy_cpu_s_per_gib": 2.0}
    summary = {"direct": {"median_mb_per_s": 100.0}, "default": variant, "record-level": variant}
    figures = compare.throughput_figures({"summary": summary})
    assert figures["default / direct"] == 0.5
    assert figures["direct MB/s"] == 100.0


def test_a_checkout_whose_bench_is_no_package_runs_its_script_by_path(tmp_path: Path) -> None:
    """`-m bench.<name>` where bench/ has `__init__.py`; `bench/<name>.py` in an older commit."""
    (tmp_path / "bench").mkdir()
    checkout = compare.Checkout("A", tmp_path)
    python = str(checkout.python)
    assert compare.bench_command(checkout, "latency", ["--quick"]) == [
        python,
        str(tmp_path / "bench" / "latency.py"),
        "--quick",
    ]
    (tmp_path / "bench" / "__init__.py").write_text('"""The benchmarks."""\n')
    assert compare.bench_command(checkout, "latency", ["--quick"]) == [
        python,
        "-m",
        "bench.latency",
        "--quick",
    ]
