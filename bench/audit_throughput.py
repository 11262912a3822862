"""Audit throughput: the Spark job on local[2] vs one Python process looping over the same files.

The audit's baseline is what it would cost without Spark: plan each segment with
`plan_segment` and run `check_unit` over every unit in one process. Both read the same generated
segments in the same run (these machines are noisy), for several total sizes, so the table shows
Spark's fixed cost per job as well as its per-byte rate. One SparkSession serves every size; its
startup is reported apart. The segments are written once per run under a temporary folder: two
topics of two partitions, magic 2 batches of 16 KiB to 1 MiB (log-uniform), keyed records of
100 B to 1 KiB of compressible text; one record in 20,000 has a null key and one in 20,000 a
timestamp two hours ahead, so the violation path runs too.

    .venv/bin/python -m bench.audit_throughput [--sizes 1,64,256,1024] [--runs 3]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import os
import pstats
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvproxy.pipeline.check import check_unit
from kvproxy.pipeline.job import AuditRequest, load_settings, run_audit
from kvproxy.pipeline.segments import RANGE_BYTES, SegmentFile, SegmentRange, discover, plan_segment
from kvproxy.pipeline.spark import start_session
from kvproxy.pipeline.task_data import AuditSettings
from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch

MIB = 1024 * 1024
PARTITIONS = (("clicks", 0), ("clicks", 1), ("orders", 0), ("orders", 1))
ODD_EVERY = 20_000
"""One record in this many has a null key, another one a timestamp two hours ahead."""
WARM_UP = 3
"""Audits of the smallest input before measuring: the first ones also pay for JIT and workers."""
SPARK_CONF = {"spark.ui.showConsoleProgress": "false"}
"""Nothing else: the job runs with the settings `kvproxy audit --master local[2]` gets."""
COMPACTED_CONFIG = """\
defaults:
  policies: [batch_integrity, crc, timestamps, compacted_key, {max_record_bytes: {limit: 1048576}}]
topics:
  - {match: clicks, compacted: true}
  - {match: orders, compacted: true}
"""


@dataclass
class Tally:
    """What one pass over an input saw; the loop's and Spark's must agree."""

    records: int = 0
    bytes: int = 0
    violations: int = 0


def text_pool(rng: random.Random) -> bytes:
    """Words to slice values from: about as compressible as JSON (gzip about 3x)."""
    words = [rng.randbytes(rng.randint(2, 6)).hex() for _ in range(5000)]
    return " ".join(rng.choice(words) for _ in range(400_000)).encode()


def generate(
    total_bytes: int, codecs: Sequence[Codec], now_ms: int, seed: int
) -> dict[tuple[str, int], list[bytes]]:
    """Batches per partition, consecutive offsets from 0, about `total_bytes` in all."""
    rng = random.Random(seed)
    pool = text_pool(rng)
    return {
        key: list(batches_of(rng, pool, total_bytes // len(PARTITIONS), codecs, now_ms))
        for key in PARTITIONS
    }


def batches_of(
    rng: random.Random, pool: bytes, total_bytes: int, codecs: Sequence[Codec], now_ms: int
) -> Iterator[bytes]:
    """One partition's batches of 16 KiB to 1 MiB, offsets from 0, about `total_bytes`."""
    written = offset = 0
    timestamp = now_ms - 86_400_000
    while written < total_bytes:
        target = int(2 ** rng.uniform(14, 20))
        records = []
        size = 0
        while size < target:
            length = rng.randint(100, 1024)
            at = rng.randrange(len(pool) - length)
            odd = rng.randrange(ODD_EVERY)
            key = None if odd == 0 else b"user-%08d" % rng.randrange(10**7)
            stamp = now_ms + 7_200_000 if odd == 1 else timestamp
            records.append((key, pool[at : at + length], None, stamp))
            size += length + 20
            timestamp += 1
        batch = build_batch(records, codec=rng.choice(codecs), base_offset=offset)
        yield batch
        offset += len(records)
        written += len(batch)


def write_input(
    folder: Path, batches: dict[tuple[str, int], list[bytes]], total_bytes: int
) -> Path:
    """`<folder>/<topic>-<partition>/00000000000000000000.log`: each partition's first batches
    up to its share of `total_bytes`, so a smaller input is a prefix of a larger one."""
    for (topic, partition), parts in batches.items():
        directory = folder / f"{topic}-{partition}"
        directory.mkdir(parents=True)
        share = total_bytes // len(batches)
        taken: list[bytes] = []
        size = 0
        for part in parts:
            if size >= share:
                break
            taken.append(part)
            size += len(part)
        (directory / "00000000000000000000.log").write_bytes(b"".join(taken))
    return folder


def segments_of(folder: Path) -> list[SegmentFile]:
    return [s for s in discover(str(folder)) if isinstance(s, SegmentFile)]


def loop_audit(folder: Path, settings: AuditSettings, range_bytes: int = RANGE_BYTES) -> Tally:
    """The baseline: plan and check every segment in this process, no Spark."""
    tally = Tally()
    for segment in segments_of(folder):
        for unit in plan_segment(segment, range_bytes):
            rows, stats = check_unit(unit, settings)
            tally.violations += len(rows)
            for item in stats:
                tally.records += item.records
                tally.bytes += item.bytes
    return tally


def spark_audit(
    spark: Any,
    folder: Path,
    output: Path,
    config: str | None,
    now_ms: int,
    *,
    range_bytes: int = RANGE_BYTES,
) -> Tally:
    request = AuditRequest(
        output=str(output),
        inputs=(str(folder),),
        config=config,
        master="local[2]",
        now_ms=now_ms,
        range_bytes=range_bytes,
    )
    summary = run_audit(request, spark, out=io.StringIO(), summary_out=io.StringIO())
    if summary["errors"]:
        raise RuntimeError(f"the audit reported input errors: {summary['errors']}")
    return Tally(summary["records_scanned"], summary["bytes_scanned"], summary["violations"])


def timed(action: Callable[[], Tally]) -> tuple[float, Tally]:
    started = time.perf_counter()
    tally = action()
    return time.perf_counter() - started, tally


@dataclass
class Row:
    label: str
    tally: Tally
    loop_s: list[float]
    spark_s: list[float]


def compare(
    label: str,
    folder: Path,
    spark: Any,
    *,
    scratch: Path,
    runs: int,
    now_ms: int,
    config: str | None = None,
    range_bytes: int = RANGE_BYTES,
) -> Row:
    """Loop and Spark alternately, `runs` times each; both must count the same."""
    settings = load_settings(config, now_ms)
    loop_s: list[float] = []
    spark_s: list[float] = []
    tally = Tally()
    for run in range(runs):
        loop_time, tally = timed(lambda: loop_audit(folder, settings, range_bytes))
        output = scratch / f"out-{run}"
        spark_time, seen = timed(
            lambda: spark_audit(spark, folder, output, config, now_ms, range_bytes=range_bytes)  # noqa: B023
        )
        shutil.rmtree(output, ignore_errors=True)
        if seen != tally:
            raise RuntimeError(f"{label}: the loop saw {tally}, Spark saw {seen}")
        loop_s.append(loop_time)
        spark_s.append(spark_time)
        print(f"  {label} run {run}: loop {loop_time:.2f} s, Spark {spark_time:.2f} s", flush=True)
    return Row(label, tally, loop_s, spark_s)


def print_table(rows: Sequence[Row]) -> None:
    print()
    print(
        "| input | MiB | records | violations | loop s | loop rec/s | loop MB/s "
        "| Spark s | Spark rec/s | Spark MB/s | Spark/loop |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        loop = min(row.loop_s)
        spark = min(row.spark_s)
        records, size = row.tally.records, row.tally.bytes
        print(
            f"| {row.label} | {size / MIB:.1f} | {records:,} | {row.tally.violations} "
            f"| {loop:.2f} | {records / loop / 1e3:,.0f} k | {size / loop / 1e6:.0f} "
            f"| {spark:.2f} | {records / spark / 1e3:,.1f} k | {size / spark / 1e6:.1f} "
            f"| {loop / spark:.2f} |"
        )


def print_growth(rows: Sequence[Row]) -> None:
    """What each step up in size costs: the per-byte rate without the fixed cost per job."""
    print()
    for small, large in itertools.pairwise(rows):
        extra = (large.tally.bytes - small.tally.bytes) / 1e6
        costs = []
        for name, seconds in (("the loop", "loop_s"), ("Spark", "spark_s")):
            more = min(getattr(large, seconds)) - min(getattr(small, seconds))
            rate = f"{extra / more:.0f} MB/s" if more > 0 else "within the noise"
            costs.append(f"{name} {more:+.2f} s ({rate})")
        print(f"{small.label} -> {large.label}: +{extra:.0f} MB costs " + ", ".join(costs))


def fixed_costs(
    spark: Any, small: Path, large: Path, *, scratch: Path, runs: int, now_ms: int
) -> None:
    """What Spark costs before any checking: an empty stage with the audit's task count, and
    the smallest audit again with 4 shuffle partitions instead of the default 200."""
    units = [unit for segment in segments_of(large) for unit in plan_segment(segment)]
    context = spark.sparkContext
    empty = []
    for _ in range(runs):
        started = time.perf_counter()
        context.parallelize(units, len(units)).map(lambda _: 0).count()
        empty.append(time.perf_counter() - started)
    print(f"an empty stage of {len(units)} tasks (one per range): best {min(empty):.2f} s")
    default, few = [], []
    for _ in range(runs):
        default.append(timed(lambda: spark_audit(spark, small, scratch / "w", None, now_ms))[0])
        spark.conf.set("spark.sql.shuffle.partitions", "4")
        try:
            few.append(timed(lambda: spark_audit(spark, small, scratch / "w", None, now_ms))[0])
        finally:
            spark.conf.unset("spark.sql.shuffle.partitions")
    print(
        f"the smallest audit, alternating: best {min(default):.2f} s with the default 200 "
        f"shuffle partitions, {min(few):.2f} s with spark.sql.shuffle.partitions=4"
    )


def time_planning(folder: Path, runs: int) -> None:
    """Planning reads only batch headers, on the driver: it should stay in milliseconds."""
    segments = segments_of(folder)
    times = []
    units: list[Any] = []
    for _ in range(runs):
        started = time.perf_counter()
        units = [unit for segment in segments for unit in plan_segment(segment)]
        times.append(time.perf_counter() - started)
    size = sum(os.path.getsize(s.uri) for s in segments)
    print(
        f"planning alone, {size / MIB:.0f} MiB in {len(segments)} segments -> {len(units)} "
        f"ranges: best {min(times) * 1e3:.1f} ms of {runs}"
    )


def profile_range(folder: Path, now_ms: int, label: str) -> None:
    """Where one range's time goes in `check_unit` (cProfile, by own time)."""
    settings = load_settings(None, now_ms)
    unit = next(
        u for s in segments_of(folder) for u in plan_segment(s) if isinstance(u, SegmentRange)
    )
    check_unit(unit, settings)  # build the routing outside the profile
    profile = cProfile.Profile()
    profile.enable()
    check_unit(unit, settings)
    profile.disable()
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("tottime").print_stats(8)
    lines = text.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
    total = stats.total_tt  # type: ignore[attr-defined]
    size = (unit.end - unit.start) / MIB
    print(f"\ncheck_unit on one {size:.1f} MiB range, {label}: {total:.3f} s under cProfile")
    print("\n".join(line for line in lines[start:] if line.strip()))


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,64,256,1024", help="total MiB per input, ascending")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--mixed-mib", type=int, default=256, help="size of the mixed-codec input")
    parser.add_argument("--tmp", default=None, help="where the segments go (default: $TMPDIR)")
    return parser.parse_args()


def _write_inputs(
    scratch: Path, sizes: list[int], mixed_mib: int, now_ms: int
) -> tuple[dict[int, Path], Path, Path]:
    """The uncompressed inputs of every size, the mixed-codec one and the compacted config."""
    started = time.perf_counter()
    plain = generate(max(sizes) * MIB, [Codec.NONE], now_ms, seed=1)
    inputs = {size: write_input(scratch / f"none-{size}", plain, size * MIB) for size in sizes}
    del plain
    mixed = generate(mixed_mib * MIB, list(Codec), now_ms, seed=2)
    mixed_input = write_input(scratch / f"mixed-{mixed_mib}", mixed, mixed_mib * MIB)
    del mixed
    config = scratch / "compacted.yaml"
    config.write_text(COMPACTED_CONFIG)
    print(f"generated the inputs in {time.perf_counter() - started:.1f} s", flush=True)
    return inputs, mixed_input, config


def _warm_spark(first: Path, scratch: Path, now_ms: int, first_mib: int) -> Any:
    """A local[2] session, warmed up by WARM_UP audits of `first` (not counted)."""
    started = time.perf_counter()
    spark = start_session("local[2]", SPARK_CONF)
    startup = time.perf_counter() - started
    spark.sparkContext.setLogLevel("ERROR")
    warm_up = [
        timed(lambda: spark_audit(spark, first, scratch / "w", None, now_ms))[0]
        for _ in range(WARM_UP)
    ]
    print(
        f"Spark session start {startup:.1f} s; first audit ({first_mib} MiB, Python workers "
        f"and JVM cold) {warm_up[0]:.1f} s, then "
        + ", ".join(f"{t:.1f}" for t in warm_up[1:])
        + " s (not counted)",
        flush=True,
    )
    return spark


def _compare_all(
    spark: Any,
    args: argparse.Namespace,
    inputs: dict[int, Path],
    mixed_input: Path,
    *,
    config: Path,
    common: dict[str, Any],
) -> tuple[list[Row], list[Row]]:
    """Spark against the loop on every size (the rows), then on the other inputs and settings."""
    sizes = list(inputs)
    rows = [compare(f"{size} MiB", inputs[size], spark, **common) for size in sizes]
    extra = [compare(f"{args.mixed_mib} MiB mixed codecs", mixed_input, spark, **common)]
    if 1024 in inputs:
        extra.append(
            compare(
                "1024 MiB, --range-mb 128", inputs[1024], spark, **common, range_bytes=128 * MIB
            )
        )
    if 256 in inputs:
        extra.append(
            compare(
                "256 MiB compacted + max_record_bytes",
                inputs[256],
                spark,
                **common,
                config=str(config),
            )
        )
    print()
    fixed_costs(spark, inputs[sizes[0]], inputs[sizes[-1]], **common)
    return rows, extra


def main() -> None:
    args = _arguments()
    sizes = [int(s) for s in args.sizes.split(",")]
    now_ms = int(time.time() * 1000)

    with tempfile.TemporaryDirectory(prefix="kvproxy-audit-bench-", dir=args.tmp) as tmp:
        scratch = Path(tmp)
        inputs, mixed_input, config = _write_inputs(scratch, sizes, args.mixed_mib, now_ms)
        spark = _warm_spark(inputs[sizes[0]], scratch, now_ms, sizes[0])
        common: dict[str, Any] = {"scratch": scratch, "runs": args.runs, "now_ms": now_ms}
        try:
            rows, extra = _compare_all(
                spark, args, inputs, mixed_input, config=config, common=common
            )
        finally:
            spark.stop()
        print_table(rows + extra)
        print(f"(best of {args.runs} runs; MB = 10^6 bytes of segment; Spark/loop = speed-up)")
        print_growth(rows)
        print()
        time_planning(inputs[256] if 256 in inputs else inputs[sizes[-1]], args.runs)
        profile_range(inputs[sizes[-1]], now_ms, "uncompressed, default policies")
        profile_range(mixed_input, now_ms, "mixed codecs, default policies")


if __name__ == "__main__":
    main()
