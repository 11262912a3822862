"""Schema registry validation in the engine (no network, one core) against its native limits.

What it measures, all in one process on the same bytes, with the registry's answers held in a
`StaticCatalog` (a warm cache: no lookup is ever timed):

(a) schema id checks: the `schema` policy (`value: required`, `strategy: topic_name`,
    `validate_payload: false`) on one magic-2 batch (one partition, one batch, as producers
    send) of 100-byte records whose values carry a registered schema id (magic byte 0, the
    4-byte id, 85 bytes of payload), 16 KiB and 1 MiB batches: `parse_records(...,
    schemas=catalog)` + `policy.validate`, records/s. Beside it, the limits: the same parse +
    iterating the records (`ProducedRecords.records()`, what any record-level check must at
    least do), the same parse + iterating the values only (`RecordBatch.values()`, no `Record`
    built), and aiokafka's C parser counting the records.
(b) payload validation (`validate_payload: true`) per format, Avro, JSON Schema and Protobuf,
    on a 16 KiB batch of small orders (six fields: id, customer, units, price, currency, paid):
    records/s through the policy, beside the decoding library's own rate on the same payloads
    (fastavro.schemaless_reader on a BytesIO; orjson.loads + the fastjsonschema validator;
    protobuf Message.FromString) and the id check alone on the same batch.

How to read it: every figure is the best of `--repeats` rounds (default 5) after a warm-up; a
round times every task once, in a loop of at least `--seconds` (default 0.2 s; `--quick`: 0.02 s,
3 rounds), so a slow spell of the machine weighs on figures and limits alike. A fresh
`ProducedRecords` is parsed for every check (it caches decoded records), as the proxy does per
request, and every verdict is asserted to be an accept. "fraction" is the figure over its limit.
The target (docs/benchmarks.md): id checks at >= 1 M records/s per core. The machine is shared
and noisy: compare fractions, not absolute figures across runs. Figures go to
bench/results/schema.json.

    .venv/bin/python -m bench.schema [--quick] [--seconds 0.2] [--repeats 5] [--profile]

`--profile` skips the measurements and prints cProfile's top functions (by own time) for (a) on
the 16 KiB batch and (b) with Avro.
"""

from __future__ import annotations

import argparse
import io
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fastavro
import fastjsonschema
import orjson

from bench._engine_calls import accepted, parser_count
from bench._engine_inputs import WORDS
from bench._order_schemas import (
    ORDER_AVRO,
    ORDER_JSON,
    SCHEMA_IDS,
    TOPIC,
    ProtoOrder,
    make_catalog,
)
from bench._results import write_results
from bench._timing import Timing, profile, time_rounds, timing_arguments
from kvproxy.policies.api import PolicyContext, ProducedRecords, parse_records
from kvproxy.policies.builtin.schema import SchemaPolicy
from kvproxy.protocol.records import build_batch
from kvproxy.protocol.records.layout import V2_HEADER_SIZE
from kvproxy.registry.catalog import StaticCatalog

KIB = 1024
MIB = 1024 * KIB
SIZES: dict[str, int] = {"16 KiB": 16 * KIB, "1 MiB": MIB}
PAYLOAD_SIZE = "16 KiB"
ID_TARGET_RPS = 1_000_000
FORMATS = ("avro", "json", "protobuf")

# ---- inputs --------------------------------------------------------------------------------


def header(schema_id: int) -> bytes:
    """Confluent's wire format header: magic byte 0, the 4-byte big-endian id."""
    return b"\x00" + schema_id.to_bytes(4, "big")


def id_records(count: int, seed: int = 7) -> list[tuple[bytes, bytes, None, None]]:
    """Keyed 100-byte records (10-byte key; 90-byte value: the header, then 85 bytes of words)."""
    rng = random.Random(seed)
    framing = header(SCHEMA_IDS["ids"])
    out = []
    for i in range(count):
        text = " ".join(rng.choice(WORDS) + str(rng.randrange(10_000)) for _ in range(14))
        out.append((b"key-%06d" % i, framing + text.encode().ljust(85, b".")[:85], None, None))
    return out


def order(index: int) -> dict[str, Any]:
    return {
        "id": f"o-{index:08d}",
        "customer": f"customer-{index % 977:04d}",
        "units": 1 + index % 9,
        "price": 9.5 + (index % 200) / 4,
        "currency": ("EUR", "USD", "GBP")[index % 3],
        "paid": index % 4 != 0,
    }


PARSED_AVRO = fastavro.parse_schema(ORDER_AVRO)
JSON_VALIDATE = fastjsonschema.compile(ORDER_JSON, use_default=False)


def encoded(fmt: str, index: int) -> bytes:
    """One order as the format's serializer writes it, without the wire format header."""
    doc = order(index)
    if fmt == "avro":
        out = io.BytesIO()
        fastavro.schemaless_writer(out, PARSED_AVRO, doc)
        return out.getvalue()
    if fmt == "json":
        return orjson.dumps(doc)
    message = ProtoOrder(**doc)
    return bytes(message.SerializeToString())


def framed(fmt: str, payload: bytes) -> bytes:
    """The payload behind its header (Protobuf: and the message indexes [0], one byte 0)."""
    return header(SCHEMA_IDS[fmt]) + (b"\x00" if fmt == "protobuf" else b"") + payload


def count_for(size: int, record_bytes: float) -> int:
    return int((size - V2_HEADER_SIZE) / record_bytes)


@dataclass(frozen=True)
class Inputs:
    """Every buffer the run measures, built once."""

    id_batches: dict[str, bytes]
    id_counts: dict[str, int]
    payload_batches: dict[str, bytes]
    """A 16 KiB batch of framed orders per format."""
    payloads: dict[str, list[bytes]]
    """The same orders' payloads, unframed (what the library decodes)."""


def build_inputs() -> Inputs:
    sample = build_batch(id_records(1000))
    per_record = (len(sample) - V2_HEADER_SIZE) / 1000
    id_counts = {label: count_for(size, per_record) for label, size in SIZES.items()}
    id_batches = {label: build_batch(id_records(id_counts[label])) for label in SIZES}
    payload_batches: dict[str, bytes] = {}
    payloads: dict[str, list[bytes]] = {}
    size = SIZES[PAYLOAD_SIZE]
    for fmt in FORMATS:
        sample_values = [framed(fmt, encoded(fmt, i)) for i in range(1000)]
        sample = build_batch(
            [(b"key-%06d" % i, v, None, None) for i, v in enumerate(sample_values)]
        )
        count = count_for(size, (len(sample) - V2_HEADER_SIZE) / 1000)
        plain = [encoded(fmt, i) for i in range(count)]
        payloads[fmt] = plain
        payload_batches[fmt] = build_batch(
            [(b"key-%06d" % i, framed(fmt, p), None, None) for i, p in enumerate(plain)]
        )
    return Inputs(id_batches, id_counts, payload_batches, payloads)


# ---- the work, as callables ----------------------------------------------------------------


def make_policy(**options: Any) -> SchemaPolicy:
    """The policy as `kvproxy serve` builds it from `{schema: {...}}`."""
    return SchemaPolicy.create(PolicyContext(), {"value": "required", **options})


def parsed(raw: bytes, catalog: StaticCatalog | None) -> ProducedRecords:
    produced = parse_records(
        TOPIC,
        0,
        raw,
        produce_version=9,
        acks=-1,
        transactional_id=None,
        compacted=False,
        now_ms=int(time.time() * 1000),
        schemas=catalog,
    )
    if not isinstance(produced, ProducedRecords):
        raise AssertionError(f"the benchmark batch does not parse: {produced}")
    return produced


def policy_check(policy: SchemaPolicy, catalog: StaticCatalog, raw: bytes) -> Callable[[], None]:
    def run() -> None:
        accepted(policy.validate(TOPIC, 0, parsed(raw, catalog)))

    return run


def parse_records_only(raw: bytes, expected: int) -> Callable[[], None]:
    def run() -> None:
        count = 0
        for _ in parsed(raw, None).records():
            count += 1
        if count != expected:
            raise AssertionError(f"read {count} of {expected} records")

    return run


def parse_values_only(raw: bytes, expected: int) -> Callable[[], None]:
    def run() -> None:
        count = 0
        for batch in parsed(raw, None).batches:
            for _ in batch.values():
                count += 1
        if count != expected:
            raise AssertionError(f"read {count} of {expected} values")

    return run


def library_decode(fmt: str, payloads: list[bytes]) -> Callable[[], None]:
    """The library's own decode (and, for JSON, validation) of every payload."""
    if fmt == "avro":
        schema = PARSED_AVRO
        reader = fastavro.schemaless_reader

        def run() -> None:
            for payload in payloads:
                reader(io.BytesIO(payload), schema, None)

    elif fmt == "json":
        validate = JSON_VALIDATE
        loads = orjson.loads

        def run() -> None:
            for payload in payloads:
                validate(loads(payload))

    else:
        from_string = ProtoOrder.FromString

        def run() -> None:
            for payload in payloads:
                from_string(payload)

    return run


def build_tasks(inputs: Inputs) -> dict[str, Callable[[], None]]:
    """Every timed callable, by the name the figures use."""
    catalog = make_catalog()
    ids_policy = make_policy()
    payload_policy = make_policy(validate_payload=True)
    tasks: dict[str, Callable[[], None]] = {}
    for label, raw in inputs.id_batches.items():
        count = inputs.id_counts[label]
        tasks[f"schema ids {label}"] = policy_check(ids_policy, catalog, raw)
        tasks[f"parse + records() {label}"] = parse_records_only(raw, count)
        tasks[f"parse + values() {label}"] = parse_values_only(raw, count)
        tasks[f"C parser count {label}"] = parser_count(raw, count)
    for fmt in FORMATS:
        raw = inputs.payload_batches[fmt]
        tasks[f"schema payload {fmt}"] = policy_check(payload_policy, catalog, raw)
        tasks[f"schema ids {fmt}"] = policy_check(ids_policy, catalog, raw)
        tasks[f"library decode {fmt}"] = library_decode(fmt, inputs.payloads[fmt])
    return tasks


# ---- figures -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One figure (records/s) beside its limits (records/s)."""

    section: str
    name: str
    input: str
    records_per_s: float
    limits: dict[str, float]
    timing: Timing
    target: str = ""
    met: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "name": self.name,
            "input": self.input,
            "records_per_s": self.records_per_s,
            "limits": self.limits,
            "fractions": {name: self.records_per_s / value for name, value in self.limits.items()},
            "seconds_per_call_best": self.timing.best,
            "seconds_per_call_median": self.timing.median,
            "calls_per_timing": self.timing.calls,
            "shortest_timing_s": self.timing.shortest,
            "target": self.target,
            "met": self.met,
        }


def rows_from(timings: dict[str, Timing], inputs: Inputs) -> list[Row]:
    rows: list[Row] = []
    for label in SIZES:
        count = inputs.id_counts[label]

        def rate(name: str, count: int = count, label: str = label) -> float:
            return count / timings[f"{name} {label}"].best

        value = rate("schema ids")
        rows.append(
            Row(
                "a",
                "schema ids",
                label,
                value,
                {
                    "parse + records()": rate("parse + records()"),
                    "parse + values()": rate("parse + values()"),
                    "C parser count": rate("C parser count"),
                },
                timings[f"schema ids {label}"],
                target=f">= {ID_TARGET_RPS / 1e6:g} M rec/s",
                met=value >= ID_TARGET_RPS,
            )
        )
    for fmt in FORMATS:
        count = len(inputs.payloads[fmt])
        timing = timings[f"schema payload {fmt}"]
        rows.append(
            Row(
                "b",
                f"schema payload {fmt}",
                f"{PAYLOAD_SIZE}, {count} rec",
                count / timing.best,
                {
                    "library decode": count / timings[f"library decode {fmt}"].best,
                    "schema ids (same batch)": count / timings[f"schema ids {fmt}"].best,
                },
                timing,
            )
        )
    return rows


def fmt_rate(value: float) -> str:
    return f"{value / 1e6:6.2f} M rec/s"


def print_table(rows: list[Row], inputs: Inputs, args: argparse.Namespace) -> None:
    print()
    print(
        f"Schema registry validation, one core, no network, warm catalog: best of {args.repeats} "
        f"rounds, timings of >= {args.seconds:g} s each, after a warm-up; fraction = figure / limit"
    )
    for label, raw in inputs.id_batches.items():
        print(f"  {label} id batch: {inputs.id_counts[label]:,} records of 100 B, {len(raw):,} B")
    for fmt in FORMATS:
        payloads = inputs.payloads[fmt]
        mean = sum(map(len, payloads)) / len(payloads)
        print(
            f"  {fmt} batch: {len(payloads):,} orders, payload {mean:.0f} B on average, "
            f"{len(inputs.payload_batches[fmt]):,} B"
        )
    titles = {
        "a": "(a) schema ids (value required, topic_name, no payload check): records/s",
        "b": f"(b) validate_payload on {PAYLOAD_SIZE} of orders: records/s",
    }
    for section, title in titles.items():
        print()
        print(title)
        print(f"{'check':<24}{'input':<17}{'figure':>14}   {'limit':<26}{'':>14}{'fraction':>10}")
        for row in (r for r in rows if r.section == section):
            verdict = "" if row.met is None else (": met" if row.met else ": NOT MET")
            first = True
            for limit_name, limit in row.limits.items():
                lead = (
                    f"{row.name:<24}{row.input:<17}{fmt_rate(row.records_per_s):>14}"
                    if first
                    else " " * 55
                )
                tail = f"   {row.target}{verdict}" if first and row.target else ""
                print(
                    f"{lead}   {limit_name:<26}{fmt_rate(limit):>14}"
                    f"{row.records_per_s / limit:10.3f}{tail}"
                )
                first = False


def print_timings(timings: dict[str, Timing]) -> None:
    print("\ntimings: best per call, median over best, calls per timing, shortest timing")
    for name, timing in timings.items():
        print(
            f"  {name:<30} {timing.best * 1e6:10.1f} us  +{timing.median / timing.best - 1:4.0%}"
            f"  {timing.calls:>7,}  {timing.shortest:5.2f} s"
        )


PROFILED = ("schema ids 16 KiB", "schema payload avro")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = timing_arguments(__doc__, argv)
    started = time.perf_counter()
    inputs = build_inputs()
    tasks = build_tasks(inputs)
    if args.profile:
        return {"profiles": profile(tasks, max(args.seconds, 1.0), PROFILED)}
    print(f"{len(tasks)} timings per round, {args.repeats} rounds", flush=True)
    timings = time_rounds(tasks, seconds=args.seconds, repeats=args.repeats)
    rows = rows_from(timings, inputs)
    print_timings(timings)
    print_table(rows, inputs, args)
    elapsed = time.perf_counter() - started
    print(f"\ntook {elapsed:.0f} s")
    figures = {
        "settings": {
            "seconds_per_timing": args.seconds,
            "rounds": args.repeats,
            "statistic": "best of the rounds (median kept per row)",
        },
        "inputs": {
            "id_batches": {
                label: {"records": inputs.id_counts[label], "record_bytes": 100, "bytes": len(raw)}
                for label, raw in inputs.id_batches.items()
            },
            "payload_batches": {
                fmt: {
                    "records": len(inputs.payloads[fmt]),
                    "payload_bytes_mean": sum(map(len, inputs.payloads[fmt]))
                    / len(inputs.payloads[fmt]),
                    "bytes": len(inputs.payload_batches[fmt]),
                }
                for fmt in FORMATS
            },
        },
        "rows": [row.as_dict() for row in rows],
        "targets": {"id_checks_records_per_s": ID_TARGET_RPS},
        "elapsed_s": elapsed,
    }
    write_results("schema", figures)
    return figures


if __name__ == "__main__":
    main()
