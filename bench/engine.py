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

    .venv/bin/python bench/engine.py [--quick] [--seconds 0.2] [--repeats 5] [--profile]

`--profile` skips the measurements and prints cProfile's top functions (by own time) for (b)
uncompressed and for (c) with the 1 MiB batch.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import math
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
from aiokafka.record.default_records import DefaultRecordBatch
from kio.schema.produce.v9 import request as produce_v9
from kio.schema.types import TopicName
from kio.static.primitive import Records, i16, i32, i32Timedelta

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, write_results

from kvproxy.policies.api import ProducedRecords, Verdict, parse_records
from kvproxy.policies.chain import PolicyChain
from kvproxy.policies.config import DEFAULT_POLICIES, build_routing
from kvproxy.protocol.compression import Codec, decompress
from kvproxy.protocol.messages import PRODUCE, decode_request, encode_request, make_request
from kvproxy.protocol.records import build_batch
from kvproxy.protocol.records.layout import V2_HEADER_SIZE
from kvproxy.proxy.produce.engine import ProduceDecision, ProduceEngine, ProduceSettings

TOPIC = "bench-engine"
BATCH_LEVEL_POLICIES: tuple[str, ...] = ("batch_integrity", "crc")
KIB = 1024
MIB = 1024 * KIB
SIZES: dict[str, int] = {"16 KiB": 16 * KIB, "1 MiB": MIB}
RECORD_LEVEL_SIZE = "16 KiB"
"""The batch size of (b)'s records/s figures."""
CODECS: tuple[Codec, ...] = (Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD)
BATCH_LEVEL_TARGET_GBPS = 2.0
RECORD_LEVEL_TARGET_RPS = 2_000_000
RECORD_LEVEL_TARGET_FRACTION = 0.4


# ---- the calls under test, kept together: the fast path behind them is being reworked -------


def make_chain(policies: Sequence[Any]) -> PolicyChain:
    """A chain built from config the way `kvproxy serve` builds the `defaults` one."""
    routing = build_routing({"mode": "enforce", "policies": list(policies)}, None, ROOT)
    return routing.chain_for(TOPIC)


def without_count_check(policies: Sequence[Any]) -> list[Any]:
    """The same policies with `batch_integrity`'s count check switched off."""
    return [
        {"batch_integrity": {"check_count": False}} if name == "batch_integrity" else name
        for name in policies
    ]


COUNT_CHECK_CHAINS: dict[str, Sequence[Any]] = {
    "default chain": DEFAULT_POLICIES,
    "default chain, LogAppendTime": (
        "batch_integrity",
        "crc",
        {"timestamps": {"type": "LogAppendTime"}},
        "compacted_key",
    ),
    "batch_integrity, crc": BATCH_LEVEL_POLICIES,
}
"""(e): the chains timed with and without the count check."""


def check(chain: PolicyChain, raw: bytes, *, compacted: bool) -> Verdict:
    """One partition of one Produce v9 request: fresh batch views, then the chain's verdict."""
    produced = parse_records(
        TOPIC,
        0,
        raw,
        produce_version=9,
        acks=-1,
        transactional_id=None,
        compacted=compacted,
        now_ms=int(time.time() * 1000),
    )
    if not isinstance(produced, ProducedRecords):
        return produced
    return chain.check(produced)


def make_engine() -> ProduceEngine:
    """The proxy's engine with the default chain, every topic not compacted."""
    routing = build_routing(None, None, ROOT)
    return ProduceEngine(routing, ProduceSettings(), lambda _topic: False)


def handle_produce(engine: ProduceEngine, frame: bytes) -> ProduceDecision:
    """What kvproxy/proxy/produce/exchange.py does with a Produce frame before sending anything."""
    return engine.decide(frame, decode_request(frame))


def produce_frame(batch: bytes) -> bytes:
    """A Produce v9 request (acks=all) carrying `batch` for partition 0 of TOPIC."""
    partition = produce_v9.PartitionProduceData(index=i32(0), records=Records(batch))
    body = produce_v9.ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=(
            produce_v9.TopicProduceData(
                name=TopicName(TOPIC),
                partition_data=(partition,),
            ),
        ),
    )
    return encode_request(make_request(PRODUCE, 9, 1, "kvproxy-bench", body))


# ---- inputs --------------------------------------------------------------------------------


WORDS: tuple[str, ...] = (
    *("click", "view", "order", "cart", "pay", "refund", "login", "logout", "search", "share"),
    *("like", "follow", "open", "close", "alpha", "beta", "gamma", "delta", "north", "south"),
    *("east", "west", "red", "green", "blue", "amber"),
)


def make_records(count: int, seed: int = 7) -> list[tuple[bytes, bytes, None, None]]:
    """Keyed 100-byte records (10-byte key, 90-byte value of words and digits, compressible
    about as much as event payloads are); timestamps are now, so `timestamps` accepts them."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        text = " ".join(rng.choice(WORDS) + str(rng.randrange(10_000)) for _ in range(14))
        value = text.encode().ljust(90, b".")[:90]
        out.append((b"key-%06d" % i, value, None, None))
    return out


@dataclass(frozen=True)
class Inputs:
    """Every buffer the run measures, built once."""

    records_per: dict[str, int]
    """Records in each batch size."""
    plain: dict[str, bytes]
    """Uncompressed batch of each size."""
    compressed: dict[tuple[str, Codec], bytes]
    """The same records compressed, per size and codec."""
    frames: dict[str, bytes]
    """A Produce v9 frame carrying the plain batch of each size."""


def build_inputs(codec_sizes: Sequence[str]) -> Inputs:
    sample = build_batch(make_records(1000))
    per_record = (len(sample) - V2_HEADER_SIZE) / 1000
    records_per: dict[str, int] = {}
    plain: dict[str, bytes] = {}
    compressed: dict[tuple[str, Codec], bytes] = {}
    for label, target in SIZES.items():
        count = int((target - V2_HEADER_SIZE) / per_record)
        records = make_records(count)
        records_per[label] = count
        plain[label] = build_batch(records)
        for codec in CODECS if label in codec_sizes else ():
            compressed[label, codec] = build_batch(records, codec=codec)
    frames = {label: produce_frame(batch) for label, batch in plain.items()}
    return Inputs(records_per, plain, compressed, frames)


# ---- timing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Seconds per call: the best and the median of the repeated timings."""

    best: float
    median: float
    calls: int
    """Calls per timing (in the last round)."""
    shortest: float
    """Seconds the shortest timing took (the whole loop)."""


def calibrate(fn: Callable[[], object], seconds: float) -> int:
    """Warm `fn` up and size its loop so that one timing takes at least `seconds`.

    The loop is doubled until it takes an eighth of `seconds`, then one loop of about half of
    `seconds` (by then warm: a cold first call would make the estimate too short) sets the size,
    with a tenth to spare.
    """
    calls = 1
    while True:
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - started
        if elapsed >= seconds / 8:
            break
        calls *= 2
    calls = max(1, math.ceil(calls * seconds / 2 / elapsed))
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - started
    return max(1, math.ceil(calls * seconds * 1.1 / elapsed))


def time_rounds(
    tasks: Mapping[str, Callable[[], object]], *, seconds: float, repeats: int
) -> dict[str, Timing]:
    """One timing of every task per round, `repeats` rounds: a slow spell of the shared machine
    then hits an engine figure and its limit alike, instead of whichever ran during it."""
    calls = {name: calibrate(fn, seconds) for name, fn in tasks.items()}
    samples: dict[str, list[float]] = {name: [] for name in tasks}
    shortest: dict[str, float] = {}
    for round_index in range(repeats):
        for name, fn in tasks.items():
            n = calls[name]
            started = time.perf_counter()
            for _ in range(n):
                fn()
            elapsed = time.perf_counter() - started
            samples[name].append(elapsed / n)
            shortest[name] = min(shortest.get(name, elapsed), elapsed)
            if elapsed < seconds:  # sized in a slow spell: longer from the next round on
                calls[name] = math.ceil(n * seconds * 1.1 / elapsed)
        print(f"  round {round_index + 1}/{repeats} done", flush=True)
    return {
        name: Timing(min(times), statistics.median(times), calls[name], shortest[name])
        for name, times in samples.items()
    }


# ---- the work, as callables ----------------------------------------------------------------


def accepted(verdict: Verdict) -> None:
    if not verdict.ok:
        raise AssertionError(f"the benchmark input was rejected: {verdict}")


def engine_check(chain: PolicyChain, raw: bytes, *, compacted: bool) -> Callable[[], None]:
    def run() -> None:
        accepted(check(chain, raw, compacted=compacted))

    return run


def engine_request(engine: ProduceEngine, frame: bytes) -> Callable[[], None]:
    def run() -> None:
        decision = handle_produce(engine, frame)
        # The original frame goes upstream only when every partition was accepted (enforce).
        if decision.forward is not frame:
            raise AssertionError(f"the benchmark request was not forwarded as is: {decision}")

    return run


def decode_only(frame: bytes) -> Callable[[], None]:
    def run() -> None:
        decode_request(frame)

    return run


def crc_only(batch: bytes) -> Callable[[], None]:
    view = memoryview(batch)

    def run() -> None:
        crc32c.crc32c(view)

    return run


def copy_only(batch: bytes) -> Callable[[], None]:
    source = bytearray(batch)

    def run() -> None:
        bytes(source)

    return run


def parser_count(batch: bytes, expected: int) -> Callable[[], None]:
    def run() -> None:
        count = 0
        for _ in DefaultRecordBatch(batch):
            count += 1
        if count != expected:
            raise AssertionError(f"C parser read {count} of {expected} records")

    return run


def parser_fields(batch: bytes, expected: int) -> Callable[[], None]:
    def run() -> None:
        count = 0
        for record in DefaultRecordBatch(batch):
            record.timestamp  # noqa: B018  # the read is what is timed
            record.key  # noqa: B018
            count += 1
        if count != expected:
            raise AssertionError(f"C parser read {count} of {expected} records")

    return run


def decompress_only(codec: Codec, batch: bytes) -> Callable[[], None]:
    payload = memoryview(batch)[V2_HEADER_SIZE:]

    def run() -> None:
        decompress(codec, payload)

    return run


def decompress_count(codec: Codec, batch: bytes, plain: bytes, expected: int) -> Callable[[], None]:
    """Decompress, then count the records with the C parser, behind the header of `plain` (the
    same batch uncompressed: attributes without codec bits), as `kvproxy.protocol.records` does."""
    payload = memoryview(batch)[V2_HEADER_SIZE:]
    header = plain[:V2_HEADER_SIZE]

    def run() -> None:
        count = 0
        for _ in DefaultRecordBatch(header + decompress(codec, payload)):
            count += 1
        if count != expected:
            raise AssertionError(f"C parser read {count} of {expected} records")

    return run


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


def profile(
    tasks: dict[str, Callable[[], None]], seconds: float, names: Sequence[str] = PROFILED
) -> dict[str, str]:
    """cProfile's top 12 functions by own time, for each task of `names`."""
    out: dict[str, str] = {}
    for name in names:
        fn = tasks[name]
        calls = calibrate(fn, seconds)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            fn()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
        out[name] = text.getvalue()
        print(f"== {name}: {calls} calls ==")
        print(out[name])
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="0.02 s timings, 3 rounds")
    parser.add_argument("--seconds", type=float, default=None, help="length of one timing")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (the best is kept)")
    parser.add_argument("--profile", action="store_true", help="only print cProfile's top lines")
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = 0.02 if args.quick else 0.2
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    started = time.perf_counter()
    inputs = build_inputs(codec_sizes=tuple(SIZES))
    tasks = build_tasks(inputs)
    if args.profile:
        return {"profiles": profile(tasks, max(args.seconds, 1.0))}
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
