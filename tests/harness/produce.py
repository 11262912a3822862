"""Produce requests through kvproxy as a raw client sends them, their decoded partition answers,
what the broker stored (read straight from Tansu, so "nothing stored" means an empty log), and
the wording of Kafka's answers."""

from __future__ import annotations

import struct
from typing import Any

from protocol.messages import FETCH, PRODUCE, decode_response
from protocol.records import build_batch
from tests.harness import Broker
from tests.harness.fuzz import produce_request
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import fetch_request, fetched_values, topic_id_of

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


def stored(tansu: Broker, topic: str, partition: int = 0) -> list[bytes | None]:
    """The values in the broker's log for topic-partition, read straight from Tansu."""
    with RawKafkaClient(tansu.host, tansu.port) as client:
        topic_id = topic_id_of(client, topic)
        answer = client.request(
            fetch_request(16, 8, topic_id, partition=partition, max_wait_ms=100, min_bytes=0)
        )
    return fetched_values(decode_response(answer, FETCH, 16).body)


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
