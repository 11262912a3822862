"""The instruction-count regression check (bench/instructions.py): its comparison with the
committed figures, and the check itself on the small cases under valgrind (`make test` installs
valgrind; the test is not skipped without it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import instructions

ROOT = Path(__file__).resolve().parents[2]
SMALL_CASES = ("produce_small", "merge_small", "accept_small", "relay_small", "relay_small_python")


def test_a_case_grown_beyond_the_tolerance_fails_the_check_by_name() -> None:
    committed = {"produce_small": 300_000, "merge_small": 500_000}
    now = {"produce_small": 309_300, "merge_small": 500_000}
    status, lines = instructions.check_report(instructions.compare(committed, now, 3.0), 3.0)
    assert status == 1
    (grew,) = [line for line in lines if line.startswith("GREW")]
    assert "produce_small: committed 300,000 Ir per iteration, now 309,300 (+3.10%)" in grew


def test_a_case_within_the_tolerance_passes() -> None:
    committed = {"produce_small": 300_000}
    for now in (308_700, 291_300):
        status, lines = instructions.check_report(
            instructions.compare(committed, {"produce_small": now}, 3.0), 3.0
        )
        assert status == 0
        assert [line.split(":")[0] for line in lines] == ["within 3.0%"]


def test_a_case_that_fell_passes_and_asks_for_the_figure_to_be_refreshed() -> None:
    status, lines = instructions.check_report(
        instructions.compare({"produce_small": 300_000}, {"produce_small": 250_000}, 3.0), 3.0
    )
    assert status == 0
    assert lines[0].startswith("FELL by more than 3.0%: produce_small")
    assert "--write" in lines[0]


def test_a_case_without_a_committed_figure_fails() -> None:
    status, lines = instructions.check_report(
        instructions.compare({}, {"produce_small": 300_000}, 3.0), 3.0
    )
    assert status == 1
    assert lines[0].startswith("NO FIGURE: produce_small")


@pytest.mark.compiled
def test_the_committed_figures_hold_for_the_small_cases() -> None:
    """The real check, under valgrind, against bench/instructions.json (about 30 s)."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.instructions", "--check", "--cases", ",".join(SMALL_CASES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for case in SMALL_CASES:
        assert f"{case}: committed" in result.stdout
