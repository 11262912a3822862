"""Two checkouts of kvproxy (say the commit before a change and after it), benchmarks alternated.

On these shared, noisy machines two runs far apart in time differ more than most changes do, so
"no loss" is read from runs interleaved in time: each chosen benchmark runs in checkout A, then in
B, then in A again, ... (`--rounds`, default 3). Each checkout runs with its own virtualenv
(`<checkout>/.venv/bin/python`) and its own bench script, so the code measured and the way it is
measured are that commit's; the figures are those the script itself computes, read from the
`bench/results/<name>.json` it writes (into a folder of this run: `KVPROXY_BENCH_RESULTS`).

The default set is the validation engine (CPU only), throughput, small-request rate and latency
(the last three against a fresh Apache Kafka per run, or Tansu with `--upstream tansu`), each with
shorter settings than its own defaults (`SETTINGS`, changed with `--args NAME="..."`) so that 3
rounds take about 15 minutes on a quiet machine. Every run has its own time bound (`--timeout`
scales them); a run that fails or overruns is shown as `x` and does not stop the others. The
table gives, per figure, every run of A and of B, the medians and B/A (B - A for added
latencies, which can be negative); the ratios to direct of a run (measured in the same run) hold
up better than absolute rates.

    .venv/bin/python -m bench.compare_commits BEFORE_CHECKOUT AFTER_CHECKOUT [--rounds 3]
        [--only engine throughput request_rate latency] [--upstream kafka|tansu]
        [--args latency="--seconds 30"] [--timeout 1.0] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

Figures = dict[str, float]

SETTINGS: dict[str, str] = {
    "engine": "--seconds 0.1 --repeats 3",
    "throughput": "--mib 200 --rounds 3",
    "request_rate": "--seconds 6 --rounds 2 --warmup 2",
    "latency": "--seconds 15 --slices 3 --round-trips 1500",
}
"""Each benchmark's arguments here (shorter than its own defaults; the same for A and B)."""
TIMEOUTS: dict[str, float] = {
    "engine": 240,
    "throughput": 420,
    "request_rate": 300,
    "latency": 300,
}
"""Seconds a run may take before it is stopped (and counted as failed)."""
WITH_UPSTREAM = {"throughput", "request_rate", "latency"}


def engine_figures(result: dict[str, Any]) -> Figures:
    """The engine's rows (a), (b), (c): each figure and its fraction of the native limit."""
    rows = {(r["name"], r["size"]): r for r in result["rows"]}
    figures: Figures = {}
    for (name, size), label, scale, unit in (
        (("batch_integrity, crc", "16 KiB"), "(a) batch-level 16 KiB", 1, "GB/s"),
        (("default chain, not compacted", "16 KiB"), "(a) default chain 16 KiB", 1, "GB/s"),
        (("default chain, compacted, none", "16 KiB"), "(b) record-level 16 KiB", 1e-6, "M rec/s"),
        (("default chain, compacted, zstd", "16 KiB"), "(b) record-level zstd", 1e-6, "M rec/s"),
        (("decode_request + decide", "1 MiB"), "(c) request 1 MiB", 1, "GB/s"),
        (("decode_request + decide", "16 KiB"), "(c) request 16 KiB", 1, "GB/s"),
    ):
        row = rows.get((name, size))
        if row is not None:
            figures[f"{label}, {unit}"] = row["value"] * scale
            figures[f"{label}, fraction of limit"] = row["fraction"]
    return figures


def throughput_figures(result: dict[str, Any]) -> Figures:
    summary = result["summary"]
    figures = {"direct MB/s": summary["direct"]["median_mb_per_s"]}
    for variant in ("default", "record-level"):
        figures[f"{variant} / direct"] = summary[variant]["ratio_to_direct"]
        figures[f"{variant} MB/s"] = summary[variant]["median_mb_per_s"]
        figures[f"{variant} proxy CPU s/GiB"] = summary[variant]["median_proxy_cpu_s_per_gib"]
    return figures


def request_rate_figures(result: dict[str, Any]) -> Figures:
    summary = result["summary"]
    return {
        "proxy / direct": summary["ratio"],
        "direct requests/s": summary["direct_requests_per_s"],
        "proxy requests/s": summary["proxy_requests_per_s"],
        "proxy CPU s/100k requests": summary["proxy_cpu_s_per_100k_requests"],
    }


def latency_figures(result: dict[str, Any]) -> Figures:
    summary = result["summary"]
    return {
        "paced: added p50 ms": summary["added_ms"]["p50"],
        "paced: added p99 ms": summary["added_ms"]["p99"],
        "paced: proxy p50 ms": summary["proxy_ms"]["p50"],
        "paced: proxy p99 ms": summary["proxy_ms"]["p99"],
        "paced: proxy CPU share": summary["proxy_cpu_share_during_proxy_slices"],
        "one at a time: added p50 ms": summary["one_at_a_time_added_ms"]["p50"],
        "one at a time: added p99 ms": summary["one_at_a_time_added_ms"]["p99"],
    }


FIGURES: dict[str, Callable[[dict[str, Any]], Figures]] = {
    "engine": engine_figures,
    "throughput": throughput_figures,
    "request_rate": request_rate_figures,
    "latency": latency_figures,
}
"""How each benchmark's results file becomes the figures compared (the default set, in order)."""


@dataclass(frozen=True)
class Checkout:
    """One side of the comparison: a repository folder with its own `.venv`."""

    label: str
    root: Path

    @property
    def python(self) -> Path:
        return self.root / ".venv" / "bin" / "python"

    def describe(self) -> str:
        """The commit and how many tracked files differ from it (they are measured too)."""

        def git(*args: str) -> str:
            done = subprocess.run(
                ["git", "-C", str(self.root), *args], capture_output=True, text=True, check=False
            )
            return done.stdout.strip()

        changed = git("status", "--short", "--untracked-files=no").splitlines()
        return f"{self.label} = {self.root}: commit {git('rev-parse', '--short=10', 'HEAD')}, " + (
            f"{len(changed)} changed tracked files" if changed else "clean"
        )


@dataclass
class Run:
    """One benchmark run in one checkout: its figures, or why there are none."""

    checkout: str
    benchmark: str
    round: int
    seconds: float
    load_at_start: float
    figures: Figures = field(default_factory=dict)
    error: str = ""


def _environment(checkout: Checkout, results: Path) -> dict[str, str]:
    """The checkout's venv first on PATH, nothing of this process's venv, results to `results`."""
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    env["PATH"] = f"{checkout.python.parent}{os.pathsep}{env.get('PATH', '')}"
    env["KVPROXY_BENCH_RESULTS"] = str(results)
    return env


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT first (the script's context managers stop its broker and proxies), then SIGKILL
    to whatever of its process tree is left (the broker runs in a session of its own)."""
    try:
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    process.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(60)
    for proc in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    process.wait()


def bench_command(checkout: Checkout, name: str, arguments: list[str]) -> list[str]:
    """The command running benchmark `name` of `checkout` from its root: `python -m bench.<name>`
    where its bench/ is a package (has `__init__.py`), else `python bench/<name>.py` by path (the
    commits from before bench/ became one)."""
    if (checkout.root / "bench" / "__init__.py").is_file():
        return [str(checkout.python), "-m", f"bench.{name}", *arguments]
    return [str(checkout.python), str(checkout.root / "bench" / f"{name}.py"), *arguments]


def run_one(
    checkout: Checkout, name: str, arguments: list[str], *, timeout: float, folder: Path, rnd: int
) -> Run:
    """Run the checkout's benchmark `name` with the checkout's python; figures from its JSON."""
    results = folder / f"{checkout.label}-{name}-r{rnd}"
    results.mkdir(parents=True)
    log = results / "output.txt"
    command = bench_command(checkout, name, arguments)
    load = os.getloadavg()[0]
    began = time.monotonic()
    print(
        f"[{time.strftime('%H:%M:%S')}] {checkout.label} r{rnd} {name} (load {load:.1f}) ...",
        end="",
        flush=True,
    )
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            cwd=checkout.root,
            env=_environment(checkout, results),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            code: int | None = process.wait(timeout)
        except subprocess.TimeoutExpired:
            _stop(process)
            code = None
    run = Run(checkout.label, name, rnd, time.monotonic() - began, load)
    if code is None:
        run.error = f"stopped after {timeout:.0f} s"
    elif code != 0:
        run.error = f"exit {code}"
    else:
        try:
            run.figures = FIGURES[name](json.loads((results / f"{name}.json").read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            run.error = f"no figures: {exc!r}"
    print(f" {run.error or 'ok'} in {run.seconds:.0f} s", flush=True)
    if run.error:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print("\n".join("    | " + line for line in tail), flush=True)
    return run


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "x"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def table(runs: list[Run], names: list[str]) -> list[str]:
    """Markdown: benchmark, figure, A runs, B runs, medians, B/A (B - A for an added latency:
    a difference of two percentiles, near zero or below it, whose ratio means nothing)."""
    lines = [
        "| benchmark | figure | A runs | B runs | A median | B median | B/A |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        mine = [r for r in runs if r.benchmark == name]
        figures = list(dict.fromkeys(f for r in mine for f in r.figures))
        if not figures:
            lines.append(f"| {name} | (no run succeeded) | | | | | |")
        for figure in figures:
            per_side: dict[str, list[float]] = {}
            for side in ("A", "B"):
                per_side[side] = [
                    r.figures.get(figure, float("nan")) for r in mine if r.checkout == side
                ]
            medians = {
                side: statistics.median(v)
                if (v := [x for x in values if not math.isnan(x)])
                else float("nan")
                for side, values in per_side.items()
            }
            if "added" in figure:
                compared = f"B - A = {medians['B'] - medians['A']:+.3f}"
            else:
                compared = _fmt(medians["B"] / medians["A"] if medians["A"] else math.nan)
            lines.append(
                f"| {name} | {figure} | {' '.join(map(_fmt, per_side['A']))} | "
                f"{' '.join(map(_fmt, per_side['B']))} | {_fmt(medians['A'])} | "
                f"{_fmt(medians['B'])} | {compared} |"
            )
    return lines


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="checkout A (the 'before'), with its own .venv")
    parser.add_argument("b", type=Path, help="checkout B (the 'after'), with its own .venv")
    parser.add_argument("--rounds", type=int, default=3, help="A/B pairs per benchmark")
    parser.add_argument("--only", nargs="+", choices=list(FIGURES), default=list(FIGURES))
    parser.add_argument("--upstream", choices=("kafka", "tansu"), default="kafka")
    parser.add_argument(
        "--args",
        action="append",
        default=[],
        metavar='NAME="ARGS"',
        help='replace a benchmark\'s arguments (default: SETTINGS), e.g. engine="--quick"',
    )
    parser.add_argument("--timeout", type=float, default=1.0, help="scale every run's bound")
    parser.add_argument("--quick", action="store_true", help="--quick to every benchmark")
    parser.add_argument("--out", type=Path, help="folder for logs and figures (default: temp)")
    return parser


def _arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, list[str]]:
    """Each chosen benchmark's arguments: SETTINGS, as replaced by `--args`, or `--quick`."""
    settings = dict(SETTINGS)
    for item in args.args:
        name, _, value = item.partition("=")
        if name not in FIGURES:
            parser.error(f"--args {item!r}: no benchmark {name!r}")
        settings[name] = value
    arguments: dict[str, list[str]] = {}
    for name in args.only:
        arguments[name] = ["--quick"] if args.quick else shlex.split(settings[name])
        if name in WITH_UPSTREAM:
            arguments[name] += ["--upstream", args.upstream]
    return arguments


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    checkouts = [Checkout("A", args.a.resolve()), Checkout("B", args.b.resolve())]
    for checkout in checkouts:
        if not checkout.python.exists() or not (checkout.root / "bench").is_dir():
            parser.error(f"{checkout.root}: needs bench/ and its own .venv/bin/python")
    arguments = _arguments(parser, args)
    folder = args.out or Path(tempfile.mkdtemp(prefix="kvproxy-compare-"))
    folder.mkdir(parents=True, exist_ok=True)

    head = [
        f"started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load average "
        + " / ".join(f"{x:.2f}" for x in os.getloadavg())
        + f", {os.cpu_count()} CPUs",
        *(checkout.describe() for checkout in checkouts),
        *(f"{name}: {' '.join(arguments[name])}" for name in args.only),
    ]
    print("\n".join(head), flush=True)
    runs: list[Run] = []
    began = time.monotonic()
    for rnd in range(1, args.rounds + 1):
        for name in args.only:
            for checkout in checkouts:
                timeout = TIMEOUTS[name] * args.timeout
                runs.append(
                    run_one(
                        checkout, name, arguments[name], timeout=timeout, folder=folder, rnd=rnd
                    )
                )
    return _finish(head, began, runs, args.only, folder)


def _finish(head: list[str], began: float, runs: list[Run], names: list[str], folder: Path) -> int:
    """Print and save the table, the runs and the failures; 1 when any run failed."""
    tail = (
        f"ended {time.strftime('%Y-%m-%d %H:%M:%S %Z')} after {time.monotonic() - began:.0f} s, "
        "load average " + " / ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    lines = [*head, tail, "", *table(runs, names)]
    print("\n" + "\n".join(lines[len(head) :]))
    (folder / "table.md").write_text("\n".join(lines) + "\n")
    (folder / "runs.json").write_text(json.dumps([vars(r) for r in runs], indent=2))
    print(f"\nlogs, results files and this table in {folder}")
    failed = [r for r in runs if r.error]
    for run in failed:
        print(f"failed: {run.checkout} r{run.round} {run.benchmark}: {run.error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
