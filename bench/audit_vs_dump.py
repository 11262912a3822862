"""The audit against one process: `kvproxy audit` end to end (a new Spark session per run, as a
user runs it) beside `kvproxy dump --json` on the same segment file, for a tiny input, a segment
of `--mib` MiB and one twice as large.

Targets (ratios from one run): the audit's cost beyond the tiny run is at most 2x dump's time on
the same file; writing and summarising take under 2 s when violations are few (summary.json's
`phases_s`); the segment twice as large costs at most 2.1x the audit's cost beyond the tiny run.

    .venv/bin/python -m bench.audit_vs_dump [--mib 256] [--runs 2] [--keep DIR]

Records are 100 B to 1 KiB of text in batches of 16 KiB to 1 MiB, uncompressed and lz4, one in
20,000 with a null key and one with a timestamp two hours ahead (a few hundred violations per
GiB), checked by the default policies with `compacted_key` on (every record is read).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.audit_throughput import COMPACTED_CONFIG, MIB, batches_of, text_pool
from kvproxy.protocol.compression import Codec

NOW_MS = 1_800_000_000_000


def segment(folder: Path, mib: float, seed: int) -> Path:
    """`<folder>/clicks-0/00000000000000000000.log` of about `mib` MiB."""
    directory = folder / "clicks-0"
    directory.mkdir(parents=True)
    rng = random.Random(seed)
    path = directory / "00000000000000000000.log"
    with path.open("wb") as out:
        for batch in batches_of(
            rng, text_pool(rng), int(mib * MIB), (Codec.NONE, Codec.LZ4), NOW_MS
        ):
            out.write(batch)
    return path


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - started


def audit(folder: Path, config: Path, output: Path) -> tuple[float, dict[str, float], int]:
    if output.exists():
        shutil.rmtree(output)
    seconds = timed(
        [
            sys.executable, "-m", "kvproxy.cli", "audit", "-c", str(config),
            "--input", str(folder), "--output", str(output), "--now", "2027-01-15T08:00:00Z",
        ]
    )  # fmt: skip
    summary = json.loads((output / "summary.json").read_text())
    return seconds, summary.get("phases_s", {}), int(summary["violations"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=256)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--keep", type=Path, default=None, help="reuse or keep the inputs here")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="kvproxy-audit-vs-dump-"))
    sizes = {"tiny": 1.0, "S": args.mib, "2S": 2 * args.mib}
    files = {}
    for label, mib in sizes.items():
        folder = root / label
        if not folder.exists():
            files[label] = segment(folder, mib, seed=7)
        else:
            files[label] = next(folder.glob("*/*.log"))
    config = root / "kvproxy.yaml"
    config.write_text(COMPACTED_CONFIG)
    audits: dict[str, list[float]] = {label: [] for label in sizes}
    dumps: dict[str, list[float]] = {label: [] for label in sizes}
    phases: dict[str, dict[str, float]] = {}
    violations: dict[str, int] = {}
    for _ in range(args.runs):
        for label in sizes:
            seconds, phase, count = audit(root / label, config, root / f"out-{label}")
            audits[label].append(seconds)
            phases[label], violations[label] = phase, count
            dumps[label].append(
                timed([sys.executable, "-m", "kvproxy.cli", "dump", "--json", str(files[label])])
            )
    med = {label: statistics.median(values) for label, values in audits.items()}
    dump = {label: statistics.median(values) for label, values in dumps.items()}
    print(f"inputs in {root}; medians of {args.runs} runs, seconds")
    print(f"{'input':6} {'MiB':>7} {'audit':>7} {'dump':>6} {'violations':>10}  phases_s")
    for label in sizes:
        size = files[label].stat().st_size / MIB
        print(
            f"{label:6} {size:7.1f} {med[label]:7.2f} {dump[label]:6.2f} "
            f"{violations[label]:10d}  {phases[label]}"
        )
    beyond_s, beyond_2s = med["S"] - med["tiny"], med["2S"] - med["tiny"]
    write_s = max(p.get("writing", 0) + p.get("summarising", 0) for p in phases.values())
    print(f"audit beyond tiny / dump, S:  {beyond_s / dump['S']:.2f}  (target <= 2)")
    print(f"audit beyond tiny / dump, 2S: {beyond_2s / dump['2S']:.2f}  (target <= 2)")
    print(f"2S / S, beyond tiny: {beyond_2s / beyond_s:.2f}  (target <= 2.1)")
    print(f"2S / S, end to end:  {med['2S'] / med['S']:.2f}")
    print(f"writing + summarising, largest: {write_s:.2f} s  (target < 2 s)")
    if args.keep is None:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
