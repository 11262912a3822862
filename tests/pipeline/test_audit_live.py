"""Audit a live topic and the proxy's quarantine: the same violations the proxy warned about.

Records go through kvproxy (mode warn, so everything reaches Tansu) into a compacted topic; the
proxy keeps every would-be rejection in its journal. Auditing the live topic (fetched from the
broker) and the journal (in the same run) must find exactly what the proxy found.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from kvproxy.journal import JournalReader
from kvproxy.pipeline.job import AuditRequest, run_audit
from kvproxy.protocol.records import iter_batches
from tests.harness import Broker
from tests.harness.proxy import run_proxy

HOUR_MS = 3_600_000
COUNT = 40


def _value(i: int) -> bytes:
    return b"v" * (50 + i)  # the size tells the records apart, keyless or not


def _produce(bootstrap: str, topic: str, now_ms: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    for i in range(COUNT):
        key = None if i % 7 == 0 else f"key-{i}".encode()
        timestamp = now_ms + 2 * HOUR_MS if i == 13 else now_ms
        producer.produce(topic, _value(i), key, partition=i % 2, timestamp=timestamp)
        if i % 10 == 9:
            producer.flush(10)
    assert producer.flush(10) == 0


def _read_back(bootstrap: str, topic: str) -> dict[tuple[int, int], int]:
    """(partition, offset) -> value size of every record in the topic."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"audit-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    # assigned partitions, no group membership: nothing to wait for but the records
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in (0, 1)])
    seen: dict[tuple[int, int], int] = {}
    deadline = time.monotonic() + 30
    while len(seen) < COUNT and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen[(message.partition(), message.offset())] = len(message.value())
    consumer.close()
    return seen


def _warned(journal: Path) -> set[tuple[str, int, int]]:
    """(policy, code, value size) of every record the proxy's journal says it warned about."""
    found = set()
    for entry in JournalReader(journal).entries():
        assert entry.kind == "warned"
        records = [r for b in iter_batches(entry.records) for r in b.records()]
        for index in entry.record_indexes:
            found.add((entry.policy or "", entry.code, len(records[index].value or b"")))
    return found


def test_live_topic_and_journal_give_what_the_proxy_warned(
    spark: Any, tansu: Broker, make_topic: Any, tmp_path: Path
) -> None:
    topic = make_topic(partitions=2, config={"cleanup.policy": "compact"})
    journal = tmp_path / "journal"
    now_ms = int(time.time() * 1000)
    with run_proxy(
        tansu.bootstrap,
        topics=[{"match": topic, "mode": "warn"}],
        quarantine={"dir": str(journal), "flush_interval_ms": 50},
    ) as proxy:
        _produce(proxy.bootstrap, topic, now_ms)
    warned = _warned(journal)
    keyless = {("compacted_key", 87, len(_value(i))) for i in range(0, COUNT, 7)}
    assert keyless <= warned  # the proxy saw the cluster's compaction and warned
    assert ("timestamps", 32, len(_value(13))) in warned

    config = tmp_path / "kvproxy.yaml"
    config.write_text(f"topics:\n  - {{match: {topic}, mode: warn}}\n")
    output = tmp_path / "out"
    summary = run_audit(
        AuditRequest(
            output=str(output),
            inputs=(str(journal),),
            config=str(config),
            bootstrap=(tansu.bootstrap,),
            topics=(topic,),
        ),
        spark,
        out=io.StringIO(),
        summary_out=io.StringIO(),
    )
    rows = [r.asDict() for r in spark.read.parquet(str(output / "violations")).collect()]
    live = [r for r in rows if r["offset"] >= 0]
    quarantined = [r for r in rows if r["offset"] == -1]
    as_found = {(r["policy"], r["error_code"], r["value_size"]) for r in live}
    assert as_found == warned
    assert len(live) == len(warned)
    assert {(r["policy"], r["error_code"], r["value_size"]) for r in quarantined} == warned
    assert all(r["mode"] == "warn" for r in rows)

    # every live row points at the record it names
    stored = _read_back(tansu.bootstrap, topic)
    assert len(stored) == COUNT
    for row in live:
        assert stored[(row["partition"], row["offset"])] == row["value_size"]
        assert row["source"].startswith("kafka://") and row["source"].endswith(
            f"/{topic}/{row['partition']}"
        )
    partitions = {k: v for k, v in summary["partitions"].items() if v["topic"] == topic}
    assert sum(p["records"] for p in partitions.values()) >= COUNT
    assert all(p["compacted"] is True for p in partitions.values())
    assert summary["errors"] == []
