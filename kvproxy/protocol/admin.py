"""The requests kvproxy makes of a cluster on its own behalf, sans-IO: Metadata, DescribeConfigs,
ListOffsets and Fetch, built for a given version and their answers read into plain values.

The proxy and the offline commands send them over asyncio (`kvproxy.client.async_requests`) and
the audit over blocking sockets (`kvproxy.client.blocking`); both build and read them here, so
they ask the same questions and understand the answers the same way. A builder takes every field any
version has and keeps the ones the asked version defines, so one call serves a fixed version and a
negotiated one alike.
"""

from __future__ import annotations

import datetime
import typing
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cache
from typing import Any, Final

from kvproxy.protocol.errors import BufferUnderflow, TooManyNodes
from kvproxy.protocol.framing import frame
from kvproxy.protocol.headers import read_unsigned_varint
from kvproxy.protocol.messages import (
    DESCRIBE_CONFIGS,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    codec_for,
    encode_request,
    make_request,
)

__all__ = [
    "EARLIEST",
    "LATEST",
    "READ_UNCOMMITTED",
    "TOPIC_RESOURCE",
    "DescribedConfig",
    "FetchedPartition",
    "brokers_of",
    "describe_configs_request",
    "described_configs",
    "fetch_request",
    "fetched_partitions",
    "list_offsets_request",
    "listed_offsets",
    "metadata_request",
    "request_frame",
]

EARLIEST: Final = -2
"""ListOffsets timestamp: the log start offset."""
LATEST: Final = -1
"""ListOffsets timestamp: the offset after the last record."""
READ_UNCOMMITTED: Final = 0
TOPIC_RESOURCE: Final = 2
"""DescribeConfigs resource type of a topic."""


def request_frame(
    api_key: int, version: int, correlation_id: int, client_id: str, body: Any
) -> bytes:
    """The whole frame (size prefix, header, body) of one request."""
    return frame(encode_request(make_request(api_key, version, correlation_id, client_id, body)))


def _build(cls: type, **values: Any) -> Any:
    """An instance of a kio schema class from the values its version has (others are dropped)."""
    names = {f.name for f in fields(cls)}
    return cls(**{name: value for name, value in values.items() if name in names})


@cache
def _element_type(cls: type, field_name: str) -> type:
    """The entity type of an array field (`tuple[X, ...]`, maybe `| None`)."""
    hint = typing.get_type_hints(cls)[field_name]
    for option in (hint, *typing.get_args(hint)):
        if typing.get_origin(option) is tuple:
            element: type = typing.get_args(option)[0]
            return element
    raise TypeError(f"{cls.__name__}.{field_name} is not an array")


def metadata_request(version: int, topics: Sequence[str] | None) -> Any:
    """Metadata of `topics` (None: every topic; empty: none, brokers only), never creating a
    topic where the version can say so (v4+)."""
    request_type = codec_for(METADATA, version).request_type
    asked = None
    if topics is not None:
        topic_type = _element_type(request_type, "topics")
        asked = tuple(_build(topic_type, name=topic, topic_id=None) for topic in topics)
    return _build(
        request_type,
        topics=asked,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


def metadata_request_by_ids(version: int, topic_ids: Sequence[uuid.UUID]) -> Any:
    """Metadata of the topics with these ids (v12+), creating none."""
    request_type = codec_for(METADATA, version).request_type
    topic_type = _element_type(request_type, "topics")
    return _build(
        request_type,
        topics=tuple(_build(topic_type, name=None, topic_id=i) for i in topic_ids),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


def metadata_topic_ids(answer: Any) -> dict[uuid.UUID, str]:
    """id -> name of every topic a Metadata answer names with its id (v10+) and no error."""
    found = {}
    for topic in answer.topics:
        topic_id = getattr(topic, "topic_id", None)
        if (
            topic_id is not None
            and topic_id.int != 0
            and topic.name is not None
            and int(topic.error_code) in (0, 5)  # NONE, LEADER_NOT_AVAILABLE: it exists
        ):
            found[topic_id] = str(topic.name)
    return found


MAX_NODES_PER_ANSWER: Final = 10_000
"""The most brokers (or coordinator / leader endpoints) one answer may name: far above any real
cluster. An answer naming more is refused whole (`TooManyNodes`): a client's connection is
closed, the proxy's own Metadata refresh counts as failed and keeps the brokers it knows."""


def check_node_count(count: int, what: str = "brokers") -> None:
    """TooManyNodes when an answer names more than `MAX_NODES_PER_ANSWER` nodes."""
    if count > MAX_NODES_PER_ANSWER:
        raise TooManyNodes(
            f"the answer names {count} nodes ({what}), more than the {MAX_NODES_PER_ANSWER} "
            "one answer may name"
        )


def metadata_broker_count(frame: bytes | memoryview, version: int) -> int:
    """How many brokers a Metadata answer (its frame, size prefix removed) says it names, read
    from the array's length before anything is decoded (a million brokers decode to a million
    objects)."""
    offset = 4  # the correlation id
    if version >= 9:  # flexible: the header's tagged fields
        count, offset = read_unsigned_varint(frame, offset)
        for _ in range(count):
            _, offset = read_unsigned_varint(frame, offset)
            size, offset = read_unsigned_varint(frame, offset)
            offset += size
    if version >= 3:
        offset += 4  # throttle_time_ms
    if version >= 9:
        length, _ = read_unsigned_varint(frame, offset)
        return max(length - 1, 0)
    if offset + 4 > len(frame):
        raise BufferUnderflow("the answer ended before its broker count")
    return max(int.from_bytes(frame[offset : offset + 4], "big", signed=True), 0)


def brokers_of(answer: Any) -> dict[int, tuple[str, int]]:
    """node id -> (host, port) of every broker a Metadata answer names (a negative id is no
    broker: left out); TooManyNodes beyond `MAX_NODES_PER_ANSWER`."""
    check_node_count(len(answer.brokers))
    return {
        int(b.node_id): (str(b.host), int(b.port)) for b in answer.brokers if int(b.node_id) >= 0
    }


def describe_configs_request(version: int, topics: Iterable[str]) -> Any:
    """DescribeConfigs of every setting of `topics` (all keys: Tansu drops the connection when
    keys are named), without synonyms or documentation."""
    request_type = codec_for(DESCRIBE_CONFIGS, version).request_type
    resource_type = _element_type(request_type, "resources")
    return _build(
        request_type,
        resources=tuple(
            _build(
                resource_type,
                resource_type=TOPIC_RESOURCE,
                resource_name=topic,
                configuration_keys=None,
            )
            for topic in topics
        ),
        include_synonyms=False,
        include_documentation=False,
    )


@dataclass(frozen=True, slots=True)
class DescribedConfig:
    """One setting of a DescribeConfigs answer: its name, value and source (-1: not said)."""

    name: str
    value: str | None
    source: int


def described_configs(
    answer: Any, topics: Iterable[str]
) -> dict[str, tuple[DescribedConfig, ...] | None]:
    """A DescribeConfigs answer's settings of each of `topics` (None: not described); results
    for other names or resource types, and results with an error, are ignored."""
    described: dict[str, tuple[DescribedConfig, ...] | None] = dict.fromkeys(topics)
    for result in answer.results:
        if int(result.resource_type) != TOPIC_RESOURCE:
            continue
        name = str(result.resource_name)
        if int(result.error_code) != 0 or name not in described:
            continue
        described[name] = tuple(
            DescribedConfig(str(entry.name), entry.value, int(getattr(entry, "config_source", -1)))
            for entry in result.configs
        )
    return described


def list_offsets_request(
    version: int, topic: str, timestamps: Mapping[int, int], *, timeout_s: float
) -> Any:
    """ListOffsets of `topic`'s partitions, each at its timestamp (EARLIEST, LATEST or a time),
    as a consumer asks (replica -1, read uncommitted)."""
    request_type = codec_for(LIST_OFFSETS, version).request_type
    topic_type = _element_type(request_type, "topics")
    partition_type = _element_type(topic_type, "partitions")
    return _build(
        request_type,
        replica_id=-1,
        isolation_level=READ_UNCOMMITTED,
        timeout=datetime.timedelta(seconds=timeout_s),
        topics=(
            _build(
                topic_type,
                name=topic,
                partitions=tuple(
                    _build(partition_type, partition_index=p, timestamp=timestamp)
                    for p, timestamp in timestamps.items()
                ),
            ),
        ),
    )


def listed_offsets(answer: Any, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (error code, offset) of `topic` in a ListOffsets answer (offset -1: no
    record at or after the time asked)."""
    listed: dict[int, tuple[int, int]] = {}
    for entry in answer.topics:
        if entry.name != topic:
            continue
        for p in entry.partitions:
            listed[int(p.partition_index)] = (int(p.error_code), int(p.offset))
    return listed


def fetch_request(
    version: int,
    topic: str,
    offsets: Mapping[int, int],
    *,
    max_bytes: int,
    partition_max_bytes: int | None = None,
    min_bytes: int = 1,
    max_wait_ms: int,
) -> Any:
    """A full, stateless Fetch (no session: id 0, epoch -1) of `topic`'s partitions from their
    offsets, read uncommitted; `partition_max_bytes` defaults to `max_bytes`."""
    request_type = codec_for(FETCH, version).request_type
    topic_type = _element_type(request_type, "topics")
    partition_type = _element_type(topic_type, "partitions")
    per_partition = max_bytes if partition_max_bytes is None else partition_max_bytes
    return _build(
        request_type,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=READ_UNCOMMITTED,
        session_id=0,
        session_epoch=-1,
        forgotten_topics_data=(),
        rack_id="",
        topics=(
            _build(
                topic_type,
                topic=topic,
                partitions=tuple(
                    _build(
                        partition_type,
                        partition=partition,
                        fetch_offset=offset,
                        log_start_offset=-1,
                        partition_max_bytes=per_partition,
                    )
                    for partition, offset in offsets.items()
                ),
            ),
        ),
    )


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """One partition of a Fetch answer: its error code, records and watermarks (-1: not said)."""

    error_code: int
    records: bytes
    high_watermark: int
    log_start: int


def fetched_partitions(answer: Any, topic: str) -> dict[int, FetchedPartition]:
    """partition -> what a Fetch answer holds for it, for `topic` (other topics are ignored)."""
    found: dict[int, FetchedPartition] = {}
    for entry in answer.responses:
        if entry.topic != topic:
            continue
        for p in entry.partitions:
            found[int(p.partition_index)] = FetchedPartition(
                int(p.error_code),
                bytes(p.records) if p.records is not None else b"",
                int(p.high_watermark),
                int(getattr(p, "log_start_offset", -1)),
            )
    return found
