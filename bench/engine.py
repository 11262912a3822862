"""Benchmark 4: the validation engine alone (no network, one core) against its native limits.

What it measures, all in one process on the same bytes, so every figure has its limit beside it:

(a) batch-level checks (`batch_integrity` with `check_count: false`, `crc`: batch headers and the
    CRC only; (e) shows what reading the records for their count adds) on one magic-2
    batch of 16 KiB and of 1 MiB (uncompressed, 100-byte records), GB/s of batch bytes, as
    `parse_records` + the chain's `check` per batch; then the default chain (`batch_integrity`,
    `crc`, `timestamps`, `compacted_key`; topic not compacted) on the same batches.
(b) record-level checks: the default chain on a compacted topic (`timestamps` and `compacted_key`
    both read every record), records/s, on 16 KiB of 100-byte records, uncompressed and with each
    codec (the same records compressed).
(c) the proxy's per-request work: `decode_request` + `ProduceEngine.decide` (what
    kvproxy/proxy/produce/exchange.py does per Produce request) over a Produce v9 frame carrying
    one 1 MiB
    batch, then one 16 KiB batch, default chain, topic not compacted: GB/s of frame bytes and
    requests/s.
(d) the limits: CRC32C, memcpy, aiokafka's C record parser (counting only; reading each record's
    timestamp and key) and each decompressor (`kvproxy.protocol.compression.decompress`, GB/s of
    output).
(e) the cost of checking each batch's records against its declared count (`batch_integrity`, as
    Kafka's record iterators do): three chains, each timed with the check and with it switched
    off, on the 16 KiB and 1 MiB batches: the default chain (whose `timestamps` scan the count
    check shares), the default chain on a LogAppendTime topic (no other check reads records),
    and `batch_integrity`, `crc` alone. Ratio = with / without (1.0: no cost).

How to read it: every figure is the best of `--repeats` rounds (default 5) after a warm-up; a
round times every task once, in a loop of at least `--seconds` (default 0.2 s; `--quick`: 0.02 s,
3 rounds, a few seconds), so a slow spell of the machine weighs on figures and limits alike. The
median and the shortest loop are printed and kept in the results file too. A fresh
`ProducedRecords` is parsed for every check (it caches decoded records), as the proxy does per
request, and every verdict is asserted to be an accept, so no fast rejection is ever timed.
"fraction" is the figure over its limit: batch-level GB/s over CRC32C GB/s; chains that decode
records and whole requests over CRC32C + the C parser reading timestamp and key (the least native
work they must do); record-level records/s over the C parser counting records (the target in
docs/benchmarks.md: >= 2 M records/s, >= 40% of it); with a codec, over decompressing +
counting. The machine is shared and noisy: compare fractions, not absolute figures across runs.
Figures are written to bench/results/engine.json.

    .venv/bin/python -m bench.engine [--quick] [--seconds 0.2] [--repeats 5] [--profile]

`--profile` skips the measurements and prints cProfile's top functions (by own time) for (b)
uncompressed and for (c) with the 1 MiB batch.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench._engine_calls import (
    BATCH_LEVEL_POLICIES,
    COUNT_CHECK_CHAINS,
    copy_only,
    crc_only,
    decode_only,
    decompress_count,
    decompress_only,
    engine_check,
    engine_request,
    make_chain,
    make_engine,
    parser_count,
    parser_fields,
    without_count_check,
)
from bench._engine_inputs import CODECS, SIZES, Inputs, build_inputs
from bench._results import write_results
from bench._timing import Timing, profile, time_rounds, timing_arguments
from kvproxy.policies.plugins import default_policies
from kvproxy.protocol.records.layout import V2_HEADER_SIZE

DEFAULT_POLICIES = default_policies()

RECORD_LEVEL_SIZE = "16 KiB"
"""The batch size of (b)'s records/s figures."""
BATCH_LEVEL_TARGET_GBPS = 2.0
RECORD_LEVEL_TARGET_RPS = 2_000_000
RECORD_LEVEL_TARGET_FRACTION = 0.4


# ---- the run -------------------------------------------------------------------------------


def build_tasks(inputs: Inputs) -> dict[str, Callable[[], None]]:
    """Every timed callable, by the name the figures use."""
    batch_chain = make_chain(without_count_check(BATCH_LEVEL_POLICIES))
    default_chain = make_chain(DEFAULT_POLICIES)
    engine = make_engine()
    tasks: dict[str, Callable[[], None]] = {}
    for label, batch in inputs.plain.items():
        count = inputs.records_per[label]
        frame = inputs.frames[label]
        tasks[f"crc32c {label}"] = crc_only(batch)
        tasks[f"memcpy {label}"] = copy_only(batch)
        tasks[f"C parser count {label}"] = parser_count(batch, count)
        tasks[f"C parser ts+key {label}"] = parser_fields(batch, count)
        tasks[f"batch_integrity, crc {label}"] = engine_check(batch_chain, batch, compacted=False)
        tasks[f"default chain, not compacted {label}"] = engine_check(
            default_chain, batch, compacted=False
        )
        tasks[f"decode_request {label}"] = decode_only(frame)
        tasks[f"decode_request + decide {label}"] = engine_request(engine, frame)
    for name, policies in COUNT_CHECK_CHAINS.items():
        with_check = make_chain(policies)
        without = make_chain(without_count_check(policies))
        for label, batch in inputs.plain.items():
            tasks[f"count check on: {name} {label}"] = engine_check(
                with_check, batch, compacted=False
            )
            tasks[f"count check off: {name} {label}"] = engine_check(
                without, batch, compacted=False
            )
    size = RECORD_LEVEL_SIZE
    count = inputs.records_per[size]
    tasks[f"default chain, compacted, none {size}"] = engine_check(
        default_chain, inputs.plain[size], compacted=True
    )
    for (label, codec), batch in inputs.compressed.items():
        name = codec.name.lower()
        tasks[f"decompress {name} {label}"] = decompress_only(codec, batch)
        if label == size:  # larger inputs only show the decompressor without per-call costs
            tasks[f"decompress {name} + C parser count {label}"] = decompress_count(
                codec, batch, inputs.plain[label], count
            )
            tasks[f"default chain, compacted, {name} {label}"] = engine_check(
                default_chain, batch, compacted=True
            )
    return tasks


def limits_from(timings: dict[str, Timing], inputs: Inputs) -> dict[str, float]:
    """(d): the native limits as rates (bytes/s or records/s), by name."""
    limits: dict[str, float] = {}
    for label, batch in inputs.plain.items():
        count = inputs.records_per[label]
        for name in ("crc32c", "memcpy"):
            limits[f"{name} {label}"] = len(batch) / timings[f"{name} {label}"].best
        for name in ("C parser count", "C parser ts+key"):
            limits[f"{name} {label}"] = count / timings[f"{name} {label}"].best
        # The least native work of a chain that decodes records: the CRC, then the parser.
        floor = timings[f"crc32c {label}"].best + timings[f"C parser ts+key {label}"].best
        limits[f"crc32c + C parser ts+key {label}"] = len(batch) / floor
    for (label, codec), _ in inputs.compressed.items():
        name = codec.name.lower()
        out_bytes = len(inputs.plain[label]) - V2_HEADER_SIZE
        limits[f"decompress {name} {label}"] = (
            out_bytes / timings[f"decompress {name} {label}"].best
        )
        key = f"decompress {name} + C parser count {label}"
        if key in timings:
            limits[key] = inputs.records_per[label] / timings[key].best
    return limits


@dataclass
class Row:
    """One engine figure beside its limit."""

    section: str
    name: str
    size: str
    value: float
    unit: str  # "GB/s" or "records/s"
    limit_name: str
    limit: float
    timing: Timing
    extra: str = ""
    target: str = ""
    met: bool | None = None

    @property
    def fraction(self) -> float:
        return self.value / self.limit

    def as_dict(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "name": self.name,
            "size": self.size,
            "value": self.value,
            "unit": self.unit,
            "limit_name": self.limit_name,
            "limit": self.limit,
            "fraction": self.fraction,
            "seconds_per_call_best": self.timing.best,
            "seconds_per_call_median": self.timing.median,
            "calls_per_timing": self.timing.calls,
            "shortest_timing_s": self.timing.shortest,
            "extra": self.extra,
            "target": self.target,
            "met": self.met,
        }


def rows_from(timings: dict[str, Timing], inputs: Inputs, limits: dict[str, float]) -> list[Row]:
    """(a), (b), (c): the engine's figures, each beside its limit."""
    rows: list[Row] = []
    for label, batch in inputs.plain.items():
        timing = timings[f"batch_integrity, crc {label}"]
        value = len(batch) / timing.best / 1e9
        on_target_size = label == RECORD_LEVEL_SIZE
        rows.append(
            Row(
                "a",
                "batch_integrity, crc",
                label,
                value,
                "GB/s",
                "CRC32C",
                limits[f"crc32c {label}"] / 1e9,
                timing,
                target=f">= {BATCH_LEVEL_TARGET_GBPS:g} GB/s" if on_target_size else "",
                met=value >= BATCH_LEVEL_TARGET_GBPS if on_target_size else None,
            )
        )
    for label, batch in inputs.plain.items():
        timing = timings[f"default chain, not compacted {label}"]
        rows.append(
            Row(
                "a",
                "default chain, not compacted",
                label,
                len(batch) / timing.best / 1e9,
                "GB/s",
                "CRC32C + C parser ts+key",
                limits[f"crc32c + C parser ts+key {label}"] / 1e9,
                timing,
                extra=f"{inputs.records_per[label] / timing.best / 1e6:.2f} M rec/s",
            )
        )

    size = RECORD_LEVEL_SIZE
    count = inputs.records_per[size]
    timing = timings[f"default chain, compacted, none {size}"]
    value = count / timing.best
    parser_limit = limits[f"C parser count {size}"]
    rows.append(
        Row(
            "b",
            "default chain, compacted, none",
            size,
            value,
            "records/s",
            "C parser count",
            parser_limit,
            timing,
            extra=f"{value / limits[f'C parser ts+key {size}']:.2f} of C parser ts+key",
            target=(
                f">= {RECORD_LEVEL_TARGET_RPS / 1e6:g} M rec/s, "
                f">= {RECORD_LEVEL_TARGET_FRACTION:.0%}"
            ),
            met=value >= RECORD_LEVEL_TARGET_RPS
            and value / parser_limit >= RECORD_LEVEL_TARGET_FRACTION,
        )
    )
    for codec in CODECS:
        name = codec.name.lower()
        timing = timings[f"default chain, compacted, {name} {size}"]
        rows.append(
            Row(
                "b",
                f"default chain, compacted, {name}",
                size,
                count / timing.best,
                "records/s",
                f"decompress {name} + C parser count",
                limits[f"decompress {name} + C parser count {size}"],
                timing,
                extra=f"{len(inputs.compressed[size, codec]):,} B compressed",
            )
        )

    for label in ("1 MiB", "16 KiB"):
        frame = inputs.frames[label]
        timing = timings[f"decode_request + decide {label}"]
        decoded = timings[f"decode_request {label}"]
        rows.append(
            Row(
                "c",
                "decode_request + decide",
                label,
                len(frame) / timing.best / 1e9,
                "GB/s",
                "CRC32C + C parser ts+key",
                limits[f"crc32c + C parser ts+key {label}"] / 1e9,
                timing,
                extra=(
                    f"{1 / timing.best:,.0f} req/s; decode_request alone "
                    f"{len(frame) / decoded.best / 1e9:.2f} GB/s"
                ),
            )
        )
    return rows


def limit_unit(name: str) -> str:
    """Parser limits are records/s; the rest (CRC, copies, decompression, the floor) GB/s."""
    return "records/s" if "parser" in name and not name.startswith("crc32c +") else "GB/s"


def fmt(value: float, unit: str) -> str:
    if unit == "GB/s":
        return f"{value:6.2f} GB/s"
    return f"{value / 1e6:6.2f} M rec/s"


SECTION_TITLES = {
    "a": "(a) batch-level checks: GB/s of batch bytes",
    "b": "(b) record-level checks on 16 KiB of 100-byte records: records/s",
    "c": "(c) per Produce request (v9, one batch): GB/s of frame bytes",
}


def print_timings(timings: dict[str, Timing]) -> None:
    print("\ntimings: best per call, median over best, calls per timing, shortest timing")
    for name, timing in timings.items():
        print(
            f"  {name:<44} {timing.best * 1e6:10.1f} us  +{timing.median / timing.best - 1:4.0%}"
            f"  {timing.calls:>7,}  {timing.shortest:5.2f} s"
        )


def count_check_figures(
    timings: dict[str, Timing], inputs: Inputs
) -> list[tuple[str, str, float, float]]:
    """(e): (chain, input, GB/s with the count check, GB/s without)."""
    out = []
    for name in COUNT_CHECK_CHAINS:
        for label, batch in inputs.plain.items():
            on = timings[f"count check on: {name} {label}"].best
            off = timings[f"count check off: {name} {label}"].best
            out.append((name, label, len(batch) / on / 1e9, len(batch) / off / 1e9))
    return out


def print_table(
    rows: list[Row],
    limits: dict[str, float],
    inputs: Inputs,
    args: argparse.Namespace,
    timings: dict[str, Timing],
) -> None:
    print()
    print(
        f"Validation engine, one core, no network: best of {args.repeats} rounds, timings of "
        f">= {args.seconds:g} s each, after a warm-up; fraction = figure / limit"
    )
    for label, batch in inputs.plain.items():
        print(
            f"  {label} batch: {inputs.records_per[label]:,} records of 100 B, "
            f"{len(batch):,} B uncompressed; Produce v9 frame {len(inputs.frames[label]):,} B"
        )
    header = f"{'check':<33}{'input':<8}{'figure':>14}   {'limit':<50}{'fraction':>9}   target"
    for section in ("a", "b", "c"):
        print()
        print(SECTION_TITLES[section])
        print(header)
        for row in (r for r in rows if r.section == section):
            verdict = "" if row.met is None else (": met" if row.met else ": NOT MET")
            limit = f"{row.limit_name:<35} {fmt(row.limit, row.unit):>14}"
            print(
                f"{row.name:<33}{row.size:<8}{fmt(row.value, row.unit):>14}   {limit:<50}"
                f"{row.fraction:9.3f}   {row.target}{verdict}"
            )
            if row.extra:
                print(f"{'':<41}({row.extra})")
    print()
    print("(e) the count check: the same chain with it and without it, GB/s of batch bytes")
    print(f"{'chain':<33}{'input':<8}{'with':>12}{'without':>12}{'ratio':>9}")
    for name, label, on, off in count_check_figures(timings, inputs):
        print(f"{name:<33}{label:<8}{fmt(on, 'GB/s'):>12}{fmt(off, 'GB/s'):>12}{on / off:9.3f}")
    print()
    print("(d) limits, same run, same bytes")
    for name, value in limits.items():
        if limit_unit(name) == "records/s":
            shown = fmt(value, "records/s")
        else:
            shown = fmt(value / 1e9, "GB/s")
        note = " of output" if name.startswith("decompress") and "parser" not in name else ""
        print(f"  {name:<46} {shown:>14}{note}")


PROFILED = (f"default chain, compacted, none {RECORD_LEVEL_SIZE}", "decode_request + decide 1 MiB")
"""What `--profile` looks into: (b) uncompressed and (c) with the 1 MiB batch."""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = timing_arguments(__doc__, argv)
    started = time.perf_counter()
    inputs = build_inputs(codec_sizes=tuple(SIZES))
    tasks = build_tasks(inputs)
    if args.profile:
        return {"profiles": profile(tasks, max(args.seconds, 1.0), PROFILED)}
    print(f"{len(tasks)} timings per round, {args.repeats} rounds", flush=True)
    timings = time_rounds(tasks, seconds=args.seconds, repeats=args.repeats)
    limits = limits_from(timings, inputs)
    rows = rows_from(timings, inputs, limits)
    print_timings(timings)
    print_table(rows, limits, inputs, args, timings)
    elapsed = time.perf_counter() - started
    print(f"\ntook {elapsed:.0f} s")
    figures = {
        "settings": {
            "seconds_per_timing": args.seconds,
            "rounds": args.repeats,
            "statistic": "best of the rounds (median kept per row)",
        },
        "inputs": {
            label: {
                "records": inputs.records_per[label],
                "record_bytes": 100,
                "batch_bytes": len(batch),
                "frame_bytes": len(inputs.frames[label]),
                "compressed_bytes": {
                    codec.name.lower(): len(data)
                    for (size, codec), data in inputs.compressed.items()
                    if size == label
                },
            }
            for label, batch in inputs.plain.items()
        },
        "rows": [row.as_dict() for row in rows],
        "count_check": [
            {"chain": name, "input": label, "gbps_with": on, "gbps_without": off}
            for name, label, on, off in count_check_figures(timings, inputs)
        ],
        "limits": limits,
        "targets": {
            "batch_level_gbps_16k": BATCH_LEVEL_TARGET_GBPS,
            "record_level_records_per_s": RECORD_LEVEL_TARGET_RPS,
            "record_level_fraction_of_c_parser": RECORD_LEVEL_TARGET_FRACTION,
        },
        "elapsed_s": elapsed,
    }
    write_results("engine", figures)
    return figures


if __name__ == "__main__":
    main()
