"""`kvproxy dump` against Kafka's own kafka-dump-log (DumpLogSegments) on segments Apache Kafka
wrote: uncompressed, the four codecs, an idempotent producer, transactions with their markers
(commit and abort), a compacted topic after the cleaner ran, and a copy with one byte flipped.
Both tools must see the same batches (offsets, count, CRC and its verdict, codec, producer
fields, position, size) and the same records (offset, timestamp, key, value, header keys, and a
marker's type and coordinator epoch)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.harness.dump_log import Batch, kafka_dump, kvproxy_dump
from tests.harness.kafka_broker import KAFKA_3, KAFKA_VERSIONS, KafkaCluster

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
KINDS = (*CODECS, "idempotent", "transactional")
RECORDS = 20  # per codec topic, in three batches


def partition_dir(cluster: KafkaCluster, topic: str) -> Path:
    return cluster.node(1).directory / "data" / f"{topic}-0"


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def produce_codec(cluster: KafkaCluster, codec: str) -> str:
    """Three batches of one codec, with a null key, a tombstone and headers among them. The
    linger is long so that only the flushes end a batch: a batch of one record sent early on a
    loaded machine is one librdkafka would send uncompressed (smaller than its compressed form)."""
    topic = cluster.create_topic()
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "compression.type": codec, "linger.ms": 60000}
    )
    for i in range(RECORDS):
        key = None if i == 3 else b"key-%d" % i
        value = None if i == 5 else b"value %d of %s" % (i, codec.encode())
        headers: list[tuple[str, str | bytes | None]] | None = (
            [("trace", b"t%d" % i), ("empty", b"")] if i % 4 == 1 else None
        )
        producer.produce(topic, key=key, value=value, headers=headers)
        if i in (6, 13):
            assert producer.flush(30) == 0
    assert producer.flush(30) == 0
    return topic


def produce_idempotent(cluster: KafkaCluster) -> str:
    topic = cluster.create_topic()
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True})
    for round_ in range(3):
        for i in range(5):
            producer.produce(topic, key=b"k%d" % i, value=b"round %d value %d" % (round_, i))
        assert producer.flush(30) == 0
    return topic


def produce_transactional(cluster: KafkaCluster) -> str:
    """Two committed transactions around an aborted one whose records reached the log."""
    topic = cluster.create_topic()
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": f"dump-{topic}"}
    )
    producer.init_transactions(60)
    for outcome, count in (("commit", 3), ("abort", 2), ("commit", 1)):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(topic, key=b"%s-%d" % (outcome.encode(), i), value=b"txn %d" % i)
        assert producer.flush(30) == 0  # the records are in the log before the marker
        if outcome == "commit":
            producer.commit_transaction(60)
        else:
            producer.abort_transaction(60)
    return topic


@dataclass
class Written:
    """Segments one broker wrote, a damaged copy of one of them, and what kafka-dump-log printed
    for all of them (one JVM run)."""

    cluster: KafkaCluster
    directories: dict[str, Path]
    damaged: Path
    kafka: dict[str, list[Batch]]


@pytest.fixture(scope="module", params=KAFKA_VERSIONS, ids=lambda v: f"kafka-{v}")
def written(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Written]:
    """One topic per kind on the session's broker of each version, written once per module."""
    name = "kafka3" if request.param == KAFKA_3 else "kafka"
    cluster: KafkaCluster = request.getfixturevalue(name)
    assert cluster.version == request.param
    topics = {codec: produce_codec(cluster, codec) for codec in CODECS}
    topics["idempotent"] = produce_idempotent(cluster)
    topics["transactional"] = produce_transactional(cluster)
    directories = {kind: partition_dir(cluster, topic) for kind, topic in topics.items()}
    damaged = damage(segments(directories["none"]), tmp_path_factory.mktemp("damaged"))
    files = [f for d in directories.values() for f in segments(d)] + [damaged]
    yield Written(cluster, directories, damaged, kafka_dump(cluster, files))


def damage(files: list[Path], into: Path) -> Path:
    """A copy of the one segment with one byte of its first batch's last record changed."""
    (original,) = files
    _, ours = kvproxy_dump([original])
    first = ours[str(original)][0]
    data = bytearray(original.read_bytes())
    data[first.position + first.size - 2] ^= 0x20
    copy = into / original.name
    copy.write_bytes(bytes(data))
    return copy


def compare(theirs: dict[str, list[Batch]], files: list[Path]) -> tuple[int, list[Batch]]:
    """kvproxy dump over `files` against what kafka-dump-log printed for them: kvproxy's exit
    code and the batches both saw (asserted equal)."""
    code, ours = kvproxy_dump(files)
    assert list(ours) == [str(f) for f in files]
    for name in ours:
        assert len(ours[name]) == len(theirs[name]), name
        for mine, kafka in zip(ours[name], theirs[name], strict=True):
            # kafka-dump-log still prints the records of a batch whose CRC fails; kvproxy not
            expected = kafka if kafka.valid else replace(kafka, records=[])
            assert mine == expected, f"{name} at byte {kafka.position}"
    return code, [batch for name in ours for batch in theirs[name]]


@pytest.mark.parametrize("kind", KINDS)
def test_dump_sees_what_kafka_dump_log_sees(written: Written, kind: str) -> None:
    code, batches = compare(written.kafka, segments(written.directories[kind]))
    assert code == 0
    assert all(batch.valid for batch in batches)
    data = [b for b in batches if not b.control]
    records = [r for b in data for r in b.records]
    offsets = [r.offset for b in batches for r in b.records]
    assert offsets == list(range(len(offsets)))
    if kind in CODECS:
        assert {b.codec for b in batches} == {kind}
        assert (len(data), len(records)) == (3, RECORDS)
        assert sum(r.key is None for r in records) == sum(r.value is None for r in records) == 1
    elif kind == "idempotent":
        assert len(records) == 15 and all(b.producer_id >= 0 for b in data)
        assert [b.base_sequence for b in data] == [0, 5, 10]
    else:
        markers = [r.marker for b in batches if b.control for r in b.records]
        assert [m[0] for m in markers if m] == ["COMMIT", "ABORT", "COMMIT"]
        assert len(records) == 6 and all(b.transactional for b in batches)


def test_a_flipped_byte_gets_the_same_crc_verdict(written: Written) -> None:
    """A copy of a real segment with one byte of its first batch's last record changed: both
    tools call that batch invalid, and only that one."""
    code, batches = compare(written.kafka, [written.damaged])
    assert code == 1
    assert [batch.valid for batch in batches] == [False, True, True]


COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "0",
    "file.delete.delay.ms": "1000",
}
KEYS = 5


def test_compacted_segments_after_cleaning(any_kafka: KafkaCluster, tmp_path: Path) -> None:
    """A compacted topic whose keys were overwritten across several segments: once the cleaner
    has rewritten them (offsets with holes, fewer records than produced), both tools read the
    cleaned segments alike."""
    topic = any_kafka.create_topic(config=COMPACTED)
    directory = partition_dir(any_kafka, topic)
    producer = Producer({"bootstrap.servers": any_kafka.bootstrap, "linger.ms": 0})
    produced, deadline = 0, time.monotonic() + 120
    cleaned: list[Path] = []
    while not cleaned:
        assert time.monotonic() < deadline, f"no cleaning seen in {directory}"
        for key in range(KEYS):  # a round overwrites every key; a round after 100 ms rolls
            producer.produce(topic, key=b"key-%d" % key, value=b"round %d" % produced)
        produced += 1
        assert producer.flush(30) == 0
        cleaned = cleaned_snapshot(directory, tmp_path, produced * KEYS)
        time.sleep(0.05)
    code, batches = compare(kafka_dump(any_kafka, cleaned), cleaned)
    assert code == 0
    offsets = [r.offset for b in batches for r in b.records]
    assert offsets == sorted(offsets) and len(offsets) < offsets[-1] + 1  # holes
    assert {r.key for b in batches for r in b.records} <= {b"key-%d" % k for k in range(KEYS)}


def cleaned_snapshot(directory: Path, into: Path, produced: int) -> list[Path]:
    """Copies of the partition's segments once the cleaner has dropped overwritten records (the
    broker may rewrite the files at any time: both tools read the same copy), else []."""
    snapshot = into / f"snapshot-{time.monotonic_ns()}"
    snapshot.mkdir()
    copies = []
    for segment in segments(directory):
        try:
            copies.append(Path(shutil.copy2(segment, snapshot / segment.name)))
        except FileNotFoundError:  # swapped out by the cleaner meanwhile
            return []
    _, dumped = kvproxy_dump(copies)
    stored = sum(len(b.records) for name in dumped for b in dumped[name])
    if len(copies) >= 2 and stored < produced:
        return copies
    shutil.rmtree(snapshot)
    return []
