"""The librdkafka producer runs of the throughput benchmarks (bench/throughput.py and
bench/workers.py): keyed JSON records of 1 KiB sent to one partition, every delivery checked,
timed on the client; and the commit the figures are for."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from bench._results import ROOT

RECORD_BYTES = 1024

DISTINCT_VALUES = 1024
"""Values cycle through this many distinct JSON documents (the same for every variant)."""

FLUSH_TIMEOUT = 120.0

PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "linger.ms": 5,
    "batch.size": 1048576,
    "queue.buffering.max.messages": 200000,
}


def source_state() -> dict[str, Any]:
    """The commit measured and the files changed in the working tree (they are measured too)."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, cwd=ROOT, check=False, timeout=30
        )
        return done.stdout.strip()

    changed = git("status", "--short", "--untracked-files=no").splitlines()
    return {"commit": git("rev-parse", "HEAD"), "changed_files": [ln.split()[-1] for ln in changed]}


def announce_source() -> dict[str, Any]:
    """`source_state()`, printed: which code the figures are for."""
    source = source_state()
    changed = len(source["changed_files"])
    print(
        f"source: commit {source['commit'][:10]}, {changed} file{'s' * (changed != 1)} changed "
        "in the working tree",
        flush=True,
    )
    return source


def json_value(index: int) -> bytes:
    """A JSON document of exactly RECORD_BYTES bytes (an order-like object padded by `note`)."""
    doc: dict[str, Any] = {
        "id": index,
        "customer": f"customer-{index % 977:04d}",
        "items": [
            {"sku": f"sku-{(index * 7 + n) % 10007:05d}", "qty": n + 1, "price": 9.5 + n}
            for n in range(4)
        ],
        "currency": "EUR",
        "paid": index % 3 != 0,
        "note": "",
    }
    pad = RECORD_BYTES - len(json.dumps(doc, separators=(",", ":")).encode())
    doc["note"] = "n" * pad
    value = json.dumps(doc, separators=(",", ":")).encode()
    assert len(value) == RECORD_BYTES, len(value)
    return value


VALUES: list[bytes] = [json_value(i) for i in range(DISTINCT_VALUES)]


def framed_values(schema_id: int) -> list[bytes]:
    """VALUES with their first 5 bytes replaced by Confluent's header (same size)."""
    header = b"\x00" + schema_id.to_bytes(4, "big")
    return [header + value[len(header) :] for value in VALUES]


def records_for(mib: float) -> int:
    """How many 1 KiB records make `mib` MiB."""
    return max(1, round(mib * 1024 * 1024 / RECORD_BYTES))


@dataclass
class ProduceRun:
    """What one producer run sent and how long it took (client side)."""

    records: int
    value_bytes: int
    seconds: float
    client_cpu_seconds: float
    delivered: int
    last_offset: int
    delivery_errors: int
    first_error: str | None
    unflushed: int
    started_at: float
    """time.monotonic() when the first record was handed over (comparable across processes)."""
    finished_at: float

    @property
    def mb_per_s(self) -> float:
        return self.value_bytes / self.seconds / 1e6


def produce(
    bootstrap: str,
    topic: str,
    records: int,
    *,
    ready: Callable[[], object] | None = None,
    values: list[bytes] | None = None,
) -> ProduceRun:
    """Send `records` keyed JSON records of 1 KiB to partition 0 of `topic`, wait for every ack
    (`values`: other 1 KiB values to cycle through instead).

    The producer connects (metadata for `topic`) before the clock starts; `ready` is called
    then, before the clock starts (several processes wait on a barrier there to start together).
    """
    errors = delivered = 0
    last_offset = -1
    first_error: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        nonlocal errors, delivered, last_offset
        if err is not None:
            errors += 1
            if not first_error:
                first_error.append(str(err))
        else:
            delivered += 1
            last_offset = max(last_offset, msg.offset() or 0)

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})
    producer.list_topics(topic, timeout=10)
    if ready is not None:
        ready()
    values = VALUES if values is None else values
    count = len(values)
    cpu0 = time.process_time()
    started_at = time.monotonic()
    started = time.perf_counter()
    for i in range(records):
        key = b"key-%09d" % i
        value = values[i % count]
        while True:
            try:
                producer.produce(topic, value, key, partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.005)
        if i & 1023 == 0:
            producer.poll(0)
    unflushed = producer.flush(FLUSH_TIMEOUT)
    seconds = time.perf_counter() - started
    finished_at = time.monotonic()
    cpu = time.process_time() - cpu0
    return ProduceRun(
        records=records,
        value_bytes=records * RECORD_BYTES,
        seconds=seconds,
        client_cpu_seconds=cpu,
        delivered=delivered,
        last_offset=last_offset,
        delivery_errors=errors,
        first_error=first_error[0] if first_error else None,
        unflushed=unflushed,
        started_at=started_at,
        finished_at=finished_at,
    )


def check_run(run: ProduceRun, label: str) -> None:
    """A run with a failed delivery or a missing acknowledgement is a benchmark error.

    The topic is fresh, so the broker's acknowledged offsets must run up to records - 1. (Tansu
    0.6's ListOffsets answers the last batch's base offset + 1 as the high watermark, so the
    delivery reports are the broker's word used here.)
    """
    if run.unflushed != 0:
        raise RuntimeError(f"{label}: flush() left {run.unflushed} records unacknowledged")
    if run.delivery_errors:
        raise RuntimeError(
            f"{label}: {run.delivery_errors} deliveries failed (first: {run.first_error})"
        )
    if run.delivered != run.records or run.last_offset != run.records - 1:
        raise RuntimeError(
            f"{label}: {run.delivered} of {run.records} records acknowledged, "
            f"last offset {run.last_offset}"
        )
