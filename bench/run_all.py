"""`make bench`: the eight benchmarks of docs/benchmarks.md, one after the other.

Each runs as its own process (a fresh broker and kvproxy each, nothing shared) and writes
`bench/results/<name>.json`; this collects what each printed into `bench/results/latest.md` with
the machine and the time each took. `--quick` passes `--quick` on (a smoke run of about a
minute); `--only NAME ...` runs some of them. Benchmarks 1, 2 and 3 run against Apache Kafka
4.4.0 unless `--upstream tansu` is given (it is passed on to them); 7 and 8 always run against
Kafka, 5 and 6 against Tansu. At the end, the rows of 1, 2 and 3 that compare kvproxy with
HAProxy in TCP mode (the floor, measured in the same run; Kafka only) are gathered into one
table, "against the floor", printed and added to the report (with the rows of 2 and 3 that
compare kvproxy with the uvloop relay and the relay with HAProxy).

    .venv/bin/python -m bench.run_all [--quick] [--only engine latency] [--upstream kafka|tansu]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench._brokers import UPSTREAMS
from bench._floor import floor_table
from bench._results import RESULTS, ROOT, machine

BENCHMARKS = (
    ("throughput", "1. End-to-end produce throughput"),
    ("request_rate", "2. Small-request rate"),
    ("latency", "3. Produce latency at 5k records/s"),
    ("engine", "4. Validation engine alone"),
    ("connections", "5. Connections: idle memory, then 100 active"),
    ("workers", "6. Scale: --workers 1 vs 2"),
    ("producer_perf", "7. Kafka's kafka-producer-perf-test, direct vs through kvproxy"),
    ("perf_rates", "8. Small requests at 5k and 20k/s: direct, HAProxy, kvproxy"),
)
WITH_UPSTREAM = {"throughput", "request_rate", "latency"}
"""The benchmarks that take `--upstream` (the others start Tansu); they measure the floor too."""
FLOOR_TITLE = "Against the floor (HAProxy TCP mode; the uvloop relay)"
FLOOR_NOTE = (
    "compared = measured / floor (measured - floor in ms for latencies) from the same run: "
    "kvproxy against HAProxy (the goals), kvproxy against the uvloop relay (bench/uvloop_relay.py, "
    "a Python relay reading nothing) and the relay against HAProxy; per round: the same for each "
    "round's (or slice's) pair of runs"
)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small and short")
    parser.add_argument("--only", nargs="+", choices=[name for name, _ in BENCHMARKS])
    parser.add_argument(
        "--upstream",
        choices=UPSTREAMS,
        default="kafka",
        help="the broker of benchmarks 1, 2 and 3 (default: Apache Kafka)",
    )
    return parser.parse_args(argv)


def _run_one(name: str, title: str, args: argparse.Namespace) -> tuple[int, list[str]]:
    """Benchmark `name` as `python -m bench.<name>` from the repository root, its output shown
    as it comes; its exit code and the report's section on it."""
    command = [sys.executable, "-m", f"bench.{name}"]
    if args.quick:
        command.append("--quick")
    if name in WITH_UPSTREAM:
        command += ["--upstream", args.upstream]
    print(f"\n=== {title}: {' '.join(command[1:])}", flush=True)
    begun = time.monotonic()
    printed: list[str] = []
    with subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:  # shown as it comes, kept for the report
            print(line, end="", flush=True)
            printed.append(line.rstrip("\n"))
    took = time.monotonic() - begun
    status = "ok" if process.returncode == 0 else f"FAILED (exit {process.returncode})"
    print(f"=== {name}: {status} in {took:.0f} s", flush=True)
    section = [
        f"## {title}",
        "",
        f"`{Path(sys.executable).name} {' '.join(command[1:])}`: {status}, {took:.0f} s",
        "",
        "```",
        *_printed(printed),
        "```",
        "",
    ]
    return process.returncode, section


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    chosen = [(n, t) for n, t in BENCHMARKS if args.only is None or n in args.only]
    RESULTS.mkdir(parents=True, exist_ok=True)
    host = machine()
    report = [
        "# kvproxy benchmarks: latest run",
        "",
        f"{host['date']}; {host['cpus']} CPUs ({host['cpu_model']}), {host['memory_gib']} GiB, "
        f"Python {host['python']}, {host['platform']}; load average at the start "
        f"{', '.join(map(str, host['load_average']))}" + ("; --quick" if args.quick else ""),
        "",
    ]
    failed = []
    started = time.monotonic()
    for name, title in chosen:
        code, section = _run_one(name, title, args)
        if code != 0:
            failed.append(name)
        report += section
    total = time.monotonic() - started
    floor = _against_floor([name for name, _ in chosen if name not in failed])
    if floor:
        print(f"\n=== {FLOOR_TITLE}\n{FLOOR_NOTE}\n" + "\n".join(floor), flush=True)
        report += [f"## {FLOOR_TITLE}", "", FLOOR_NOTE, "", "```", *floor, "```", ""]
    report.append(f"All {len(chosen)} took {total:.0f} s.")
    out = RESULTS / "latest.md"
    out.write_text("\n".join(report) + "\n")
    print(f"\n{len(chosen) - len(failed)}/{len(chosen)} ran in {total:.0f} s; figures in {out}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _against_floor(ran: list[str]) -> list[str]:
    """The table of every "against the floor" row the benchmarks that ran wrote (none with
    `--upstream tansu`: Tansu has no floor)."""
    rows = []
    for name in ran:
        if name in WITH_UPSTREAM:
            rows += json.loads((RESULTS / f"{name}.json").read_text()).get("against_floor", [])
    return floor_table(rows) if rows else []


def _printed(lines: list[str]) -> list[str]:
    """What a benchmark printed, without librdkafka's connection chatter."""
    return [line for line in lines if not line.startswith("%")]


if __name__ == "__main__":
    sys.exit(main())
