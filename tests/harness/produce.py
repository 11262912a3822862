"""Produce requests through kvproxy as a raw client sends them, their decoded partition answers,
what the broker stored (read straight from Tansu or Kafka, so "nothing stored" means an empty log),
and the wording of Kafka's answers."""

from __future__ import annotations

import struct
from typing import Any

from kvproxy.protocol.messages import FETCH, PRODUCE, decode_response
from kvproxy.protocol.records import RecordBatch, build_batch, iter_batches
from tests.harness import Broker
from tests.harness.fuzz import produce_request
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import fetch_request, topic_id_of

CLIENT_ID = "kvproxy-policies"
INVALID_RECORD = 87
CORRUPT_MESSAGE = 2


Part = tuple[str, int, bytes | None]


def produce_frame(
    version: int,
    correlation_id: int,
    parts: list[Part],
    *,
    acks: int = -1,
    transactional_id: str | None = None,
) -> bytes:
    """A Produce request of `version` carrying `parts` = [(topic, partition, records bytes)].

    Partitions of one topic are grouped under that topic in the order given.
    """
    return produce_request(
        version,
        correlation_id,
        parts,
        acks=acks,
        transactional_id=transactional_id,
        client_id=CLIENT_ID,
    )


def batch(*values: bytes | None, key: bytes | None = b"k", **options: Any) -> bytes:
    """One magic-2 batch (or magic 0/1 message set with magic=...) of `values`, all with `key`."""
    return build_batch([(key, value, None, None) for value in values], **options)


def partitions_of(body: Any) -> dict[tuple[str, int], Any]:
    return {
        (str(topic.name), int(p.index)): p
        for topic in body.responses
        for p in topic.partition_responses
    }


def produce(
    host: str, port: int, version: int, parts: list[Part], **options: Any
) -> dict[tuple[str, int], Any]:
    """Send one Produce request and return its decoded partition answers by (topic, index)."""
    with RawKafkaClient(host, port) as client:
        answer = client.request(produce_frame(version, 7, parts, **options), timeout=10)
    assert struct.unpack_from(">i", answer)[0] == 7
    return partitions_of(decode_response(answer, PRODUCE, version).body)


def record_errors(partition: Any) -> list[tuple[int, str | None]]:
    return [(int(e.batch_index), e.batch_index_error_message) for e in partition.record_errors]


def stored_batches(broker: Broker, topic: str, partition: int = 0) -> list[RecordBatch]:
    """Every batch in the broker's log for topic-partition (Tansu or Kafka, read straight from
    it), control batches included, Fetch after Fetch up to the high watermark: Kafka may answer
    one Fetch with fewer batches than it holds."""
    found: list[RecordBatch] = []
    with RawKafkaClient(broker.host, broker.port) as client:
        topic_id = topic_id_of(client, topic)
        while True:
            offset = found[-1].base_offset + found[-1].last_offset_delta + 1 if found else 0
            request = fetch_request(
                16, 8, topic_id, offset=offset, partition=partition, max_wait_ms=100, min_bytes=0
            )
            body = decode_response(client.request(request), FETCH, 16).body
            [fetched] = [p for t in body.responses for p in t.partitions]
            assert fetched.error_code == 0, fetched
            batches = list(iter_batches(fetched.records or b"", allow_partial_tail=True))
            found += batches
            if not batches or offset >= fetched.high_watermark:
                return found


def stored(broker: Broker, topic: str, partition: int = 0) -> list[bytes | None]:
    """The values in the broker's log for topic-partition (transaction markers hold none)."""
    return [
        record.value
        for batch in stored_batches(broker, topic, partition)
        if not batch.is_control
        for record in batch.records()
    ]


JSON_ONLY = {"policies": ["batch_integrity", "crc", "json"]}
ANOTHER_PARTITION = (
    "Invalid record in another topic-partition caused the whole request to be rejected"
)


def kafka_message(record_errors_list: list[tuple[int, str]]) -> str:
    """LogValidator.processRecordErrors' message for INVALID_RECORD."""
    shown = ", ".join(
        f"RecordError(batchIndex={i}, message='{m}')" for i, m in record_errors_list[:3]
    )
    return (
        f"One or more records have been rejected due to {len(record_errors_list)} record errors "
        f"in total, and only showing the first three errors at most: [{shown}]"
    )


def compacted_message(topic: str, partition: int) -> str:
    return (
        f"Compacted topic cannot accept message without key in topic partition {topic}-{partition}"
    )
