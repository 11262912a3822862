"""Instruction counts of the Produce hot path on fixed inputs: a regression check that a noisy
machine cannot fool.

Times on these shared machines move by tens of percent from one run to the next; the number of
instructions the interpreter executes for the same work on the same inputs does not. Each case
runs a fixed request through the calls the proxy makes per Produce request (`read_unless_many`,
`ProduceEngine.decide` with an inline allowance, then `ProduceExchange.merged` on the broker's
answer) under valgrind's callgrind, counting instructions executed (Ir) in the loop only:

- valgrind starts with instrumentation off (`--instr-atstart=no`): importing and building the
  inputs run at valgrind's plain speed and are never counted;
- each case is warmed up (the interpreter specialises its bytecode in the first runs), then the
  process switches instrumentation on for itself (`vgdb ... instrumentation on`);
- each case's loop runs inside one `functools.reduce` call, and callgrind collects only inside
  that C function (`--toggle-collect=functools_reduce`) and writes one profile as it returns
  (`--dump-after`), so each profile holds exactly one case; the garbage collector is off during
  the loop (collect before): a collection's timing depends on what ran before, not on the case.

The cases are `bench/_instruction_cases.py`'s; their inputs are built in the process,
deterministically: keyed records of exactly 1 KiB (10-byte
key, 1014-byte JSON value from a seeded generator), every timestamp and the decision's clock
fixed at 2026-01-01T00:00:00Z, PYTHONHASHSEED=0.

    .venv/bin/python -m bench.instructions            # measure and print, Ir per iteration
    .venv/bin/python -m bench.instructions --check    # compare with bench/instructions.json
    .venv/bin/python -m bench.instructions --write    # refresh bench/instructions.json
    .venv/bin/python -m bench.instructions --repeat 3 # the spread of 3 whole runs

`--check` fails (exit 1) when a case costs more than TOLERANCE_PERCENT above its committed
figure, and says so when one costs that much less (refresh the figure with `--write`). Figures
are kept per interpreter build (`sys.version`) and per record scan (compiled or not): either
counts differently.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import importlib.metadata
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._instruction_cases import CASES, WARM_UP
from kvproxy.protocol.records import skim

ROOT = Path(__file__).resolve().parents[1]

FIGURES = ROOT / "bench" / "instructions.json"
TOLERANCE_PERCENT = 3.0
"""How much a case may grow before `--check` fails. Repeated runs agree to the instruction, so
the margin is for changes that move a count without touching the hot path (what else is imported
or allocated changes dict sizes and the allocator's state); a real slowdown of the hot path (an
extra pass over the records, a copy of the batch, a per-record call) costs more than 3%."""
TOGGLE = "functools_reduce"
"""The C function callgrind collects in: the measured loops are its only calls."""
VGDB_PREFIX = "KVPROXY_VGDB_PREFIX"
"""Where the measured process finds valgrind's FIFOs (in the run's own temporary directory)."""


# ---- inside valgrind -----------------------------------------------------------------------


def instrumentation_on() -> None:
    """Ask valgrind's gdbserver, through vgdb, to instrument from now on. The interpreter keeps
    running meanwhile (valgrind polls for vgdb's command while code runs, not in a syscall)."""
    prefix = os.environ[VGDB_PREFIX]
    vgdb = subprocess.Popen(
        ["vgdb", f"--vgdb-prefix={prefix}", f"--pid={os.getpid()}", "instrumentation", "on"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while vgdb.poll() is None and time.monotonic() < deadline:
        pass
    if vgdb.poll() != 0:
        vgdb.kill()
        output = vgdb.communicate()[0].decode(errors="replace")
        raise SystemExit(f"vgdb could not switch instrumentation on: {output}")


def run_measured(names: Sequence[str]) -> None:
    """Build and warm up every case, then run each one's loop inside one `functools.reduce`."""
    steps = {name: CASES[name].build() for name in names}
    for step in steps.values():
        for _ in range(WARM_UP):
            step()
    instrumentation_on()
    for name in names:
        step = steps[name]
        gc.collect()
        gc.disable()
        try:
            counted_loop(step, CASES[name].iterations)
        finally:
            gc.enable()


def counted_loop(step: Callable[[], object], iterations: int) -> None:
    """`step` run `iterations` times inside one call of the C function callgrind counts in."""
    functools.reduce(lambda _acc, _i: step(), range(iterations), None)


# ---- outside: valgrind runs and figures ----------------------------------------------------


def measure(names: Sequence[str]) -> dict[str, int]:
    """One valgrind run of the named cases: instructions per iteration of each."""
    if shutil.which("valgrind") is None or shutil.which("vgdb") is None:
        raise SystemExit("valgrind is missing: apt-get install valgrind (make test installs it)")
    with tempfile.TemporaryDirectory(prefix="kvproxy-callgrind-") as tmp:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--collect-atstart=no",
            f"--toggle-collect={TOGGLE}",
            f"--dump-after={TOGGLE}",
            f"--callgrind-out-file={tmp}/callgrind.out",
            f"--vgdb-prefix={tmp}/vgdb",
            sys.executable,
            "-m",
            "bench.instructions",
            "--inside",
            ",".join(names),
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0", VGDB_PREFIX: f"{tmp}/vgdb"}
        result = subprocess.run(
            command, env=env, cwd=ROOT, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise SystemExit(f"the measured run failed:\n{result.stdout}{result.stderr}")
        dumps = sorted(Path(tmp).glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        totals = [_total(dump) for dump in dumps]
    if len(totals) != len(names):
        raise SystemExit(
            f"{len(totals)} profiles for {len(names)} cases: something else called {TOGGLE}"
        )
    return {
        name: round(total / CASES[name].iterations)
        for name, total in zip(names, totals, strict=True)
    }


def _total(dump: Path) -> int:
    match = re.search(r"^totals: (\d+)", dump.read_text(), re.MULTILINE)
    if match is None or int(match[1]) == 0:
        raise SystemExit(f"{dump.name} counted nothing: was instrumentation switched on?")
    return int(match[1])


def interpreter() -> str:
    """The key of the figures: the interpreter's build and whether the record scan is compiled
    (`kvproxy.protocol.records.skim.COMPILED`); either changes the counts by far more than the
    tolerance."""
    scan = "compiled" if skim.COMPILED else "pure Python"
    return f"{platform.python_implementation()} {sys.version} {platform.machine()}, {scan} scan"


@dataclass(frozen=True)
class Change:
    case: str
    committed: int
    now: int

    @property
    def percent(self) -> float:
        return (self.now - self.committed) / self.committed * 100

    def describe(self) -> str:
        return (
            f"{self.case}: committed {self.committed:,} Ir per iteration, now {self.now:,} "
            f"({self.percent:+.2f}%)"
        )


@dataclass(frozen=True)
class Comparison:
    grew: tuple[Change, ...]
    """Cases above the committed figure by more than the tolerance: the check fails."""
    fell: tuple[Change, ...]
    """Cases below it by more than the tolerance: the figure should be refreshed."""
    within: tuple[Change, ...]
    missing: tuple[str, ...]
    """Measured cases with no committed figure."""


def compare(
    committed: Mapping[str, int], now: Mapping[str, int], tolerance_percent: float
) -> Comparison:
    changes = [
        Change(case, committed[case], count) for case, count in now.items() if case in committed
    ]
    return Comparison(
        grew=tuple(c for c in changes if c.percent > tolerance_percent),
        fell=tuple(c for c in changes if c.percent < -tolerance_percent),
        within=tuple(c for c in changes if abs(c.percent) <= tolerance_percent),
        missing=tuple(case for case in now if case not in committed),
    )


def check_report(comparison: Comparison, tolerance_percent: float) -> tuple[int, list[str]]:
    """The exit status of `--check` and what it prints."""
    lines = [f"within {tolerance_percent}%: {c.describe()}" for c in comparison.within]
    lines += [
        f"FELL by more than {tolerance_percent}%: {c.describe()}; refresh the committed figure "
        "with `python -m bench.instructions --write`"
        for c in comparison.fell
    ]
    lines += [
        f"GREW by more than {tolerance_percent}%: {c.describe()}; the hot path got slower (or, "
        "for a deliberate change, refresh with `python -m bench.instructions --write`)"
        for c in comparison.grew
    ]
    lines += [
        f"NO FIGURE: {case} has no committed figure for this build; "
        "`python -m bench.instructions --write` adds it"
        for case in comparison.missing
    ]
    return (1 if comparison.grew or comparison.missing else 0), lines


def load_figures(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def write_figures(path: Path, counts: Mapping[str, int]) -> None:
    """Add or replace this interpreter's figures for the measured cases."""
    figures = load_figures(path)
    figures["what"] = (
        "Instructions (callgrind Ir) per iteration of each case of bench/instructions.py, per "
        "interpreter build; refreshed with `python -m bench.instructions --write`"
    )
    figures["tolerance_percent"] = TOLERANCE_PERCENT
    figures["cases"] = {name: case.description for name, case in CASES.items()}
    builds = figures.setdefault("interpreters", {})
    entry = builds.setdefault(interpreter(), {})
    entry["python"] = platform.python_version()
    entry["libraries"] = {
        name: importlib.metadata.version(name) for name in ("kio", "aiokafka", "crc32c", "orjson")
    }
    entry["commit"] = _commit()
    entry["written"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%MZ")
    entry.setdefault("ir_per_iteration", {}).update(counts)
    entry["iterations"] = {name: CASES[name].iterations for name in entry["ir_per_iteration"]}
    path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")


def _commit() -> str:
    result = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="compare with the committed figure")
    action.add_argument("--write", action="store_true", help="refresh the committed figure")
    action.add_argument("--inside", help=argparse.SUPPRESS)  # the process valgrind runs
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--repeat", type=int, default=1, help="whole runs (shows the spread)")
    parser.add_argument("--figures", type=Path, default=FIGURES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        run_measured(args.inside.split(","))
        return 0
    names = args.cases.split(",")
    unknown = [name for name in names if name not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    started = time.monotonic()
    runs = [measure(names) for _ in range(args.repeat)]
    counts = {name: round(statistics.median(run[name] for run in runs)) for name in names}
    for name in names:
        seen = [run[name] for run in runs]
        spread = (max(seen) - min(seen)) / min(seen) * 100
        detail = f"  runs {', '.join(f'{s:,}' for s in seen)}, spread {spread:.3f}%"
        print(f"{name}: {counts[name]:,} Ir per iteration" + (detail if len(runs) > 1 else ""))
    print(f"({time.monotonic() - started:.0f} s, {interpreter()})")
    if args.write:
        write_figures(args.figures, counts)
        print(f"written to {args.figures}")
        return 0
    if not args.check:
        return 0
    build = load_figures(args.figures).get("interpreters", {}).get(interpreter(), {})
    status, lines = check_report(
        compare(build.get("ir_per_iteration", {}), counts, TOLERANCE_PERCENT), TOLERANCE_PERCENT
    )
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
