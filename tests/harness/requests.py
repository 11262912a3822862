"""Raw request builders for the proxy tests (project codec, kio classes): Metadata, Produce of
one batch, Fetch by topic id, ApiVersions at any version, and what their answers carry."""

from __future__ import annotations

import datetime
import struct
import time
import uuid
from typing import Any

from kvproxy.protocol.messages import (
    API_VERSIONS,
    FETCH,
    METADATA,
    PRODUCE,
    decode_response,
    encode_request,
    make_request,
)
from kvproxy.protocol.records import build_batch, iter_batches
from tests.harness.raw_client import RawKafkaClient

CLIENT_ID = "kvproxy-ordering"


def metadata_request(version: int, correlation_id: int, topics: list[str] | None = None) -> bytes:
    """A Metadata request for `topics` (None: every topic) at `version` (1 or 12 here)."""
    if version == 12:
        from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

        wanted = (
            None
            if topics is None
            else tuple(MetadataRequestTopic(topic_id=None, name=name) for name in topics)
        )
        body: Any = MetadataRequest(
            topics=wanted,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
    elif version == 1:
        from kio.schema.metadata.v1.request import MetadataRequest as MetadataRequestV1
        from kio.schema.metadata.v1.request import MetadataRequestTopic as TopicV1

        body = MetadataRequestV1(
            topics=None if topics is None else tuple(TopicV1(name=name) for name in topics)
        )
    else:
        raise ValueError(f"no builder for Metadata v{version}")
    return encode_request(make_request(METADATA, version, correlation_id, CLIENT_ID, body))


def produce_request(
    version: int,
    correlation_id: int,
    topic: str,
    records: list[tuple[bytes | None, bytes]],
    *,
    acks: int = -1,
    partition: int = 0,
    client_id: str = CLIENT_ID,
) -> bytes:
    """A Produce request of one magic-2 batch for `topic`/`partition` (keys may be None)."""
    import importlib

    from kio.static.primitive import i16, i32, i32Timedelta

    schema = importlib.import_module(f"kio.schema.produce.v{version}.request")
    batch = build_batch([(key, value, None, None) for key, value in records])
    body = schema.ProduceRequest(
        transactional_id=None,
        acks=i16(acks),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        topic_data=(
            schema.TopicProduceData(
                name=topic,
                partition_data=(schema.PartitionProduceData(index=i32(partition), records=batch),),
            ),
        ),
    )
    return encode_request(make_request(PRODUCE, version, correlation_id, client_id, body))


def fetch_request(
    version: int,
    correlation_id: int,
    topic_id: uuid.UUID,
    *,
    offset: int = 0,
    max_wait_ms: int = 500,
    min_bytes: int = 1,
    partition: int = 0,
) -> bytes:
    """A Fetch v13+ request (topics named by id) for one partition."""
    import importlib

    from kio.static.primitive import i32, i32Timedelta, i64

    schema = importlib.import_module(f"kio.schema.fetch.v{version}.request")
    body = schema.FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=max_wait_ms)),
        min_bytes=i32(min_bytes),
        topics=(
            schema.FetchTopic(
                topic_id=topic_id,
                partitions=(
                    schema.FetchPartition(
                        partition=i32(partition),
                        fetch_offset=i64(offset),
                        partition_max_bytes=i32(1024 * 1024),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    return encode_request(make_request(FETCH, version, correlation_id, CLIENT_ID, body))


def api_versions_request(version: int, correlation_id: int) -> bytes:
    """ApiVersions at any version; above v4 (unknown to the proxy) it is hand-written, as a
    newer client would send it: header v2 and a v3-shaped body."""
    if version <= 4:
        import importlib

        schema = importlib.import_module(f"kio.schema.api_versions.v{version}.request")
        fields = (
            {"client_software_name": "kvproxy-tests", "client_software_version": "1.0"}
            if version >= 3
            else {}
        )
        body = schema.ApiVersionsRequest(**fields)
        return encode_request(make_request(API_VERSIONS, version, correlation_id, CLIENT_ID, body))
    client_id = CLIENT_ID.encode()
    name, soft = b"kvproxy-tests", b"9.9"
    return (
        struct.pack(">hhih", API_VERSIONS, version, correlation_id, len(client_id))
        + client_id
        + b"\x00"  # header tagged fields
        + bytes([len(name) + 1])
        + name
        + bytes([len(soft) + 1])
        + soft
        + b"\x00"  # body tagged fields
    )


def correlation_id_of(answer: bytes) -> int:
    return int(struct.unpack_from(">i", answer)[0])


def topic_id_of(
    client: RawKafkaClient, topic: str, correlation_id: int = 900, timeout: float = 15.0
) -> uuid.UUID:
    """The topic's id, asked until the broker answering knows the topic (a topic just created
    reaches every broker's metadata within moments, not at once)."""
    deadline = time.monotonic() + timeout
    while True:
        body = decode_response(
            client.request(metadata_request(12, correlation_id, [topic])), METADATA, 12
        ).body
        (found,) = body.topics
        if int(found.error_code) not in (3, 5) or time.monotonic() > deadline:
            break  # 3 UNKNOWN_TOPIC_OR_PARTITION, 5 LEADER_NOT_AVAILABLE: not there yet
        time.sleep(0.1)
    assert found.error_code == 0 and found.topic_id is not None
    return found.topic_id


def fetched_values(body: Any) -> list[bytes | None]:
    values: list[bytes | None] = []
    for topic in body.responses:
        for partition in topic.partitions:
            assert partition.error_code == 0
            for batch in iter_batches(partition.records or b"", allow_partial_tail=True):
                if not batch.is_control:  # a transaction marker (Kafka writes them) holds no value
                    values.extend(record.value for record in batch.records())
    return values
