"""The requests of the proxy and the offline commands to the cluster, over the asyncio driver:
where brokers live, which topics exist, what topics are set to, a partition's leader, producing
and reading one partition's records.

Each asks a fixed version every broker still serves, on a connection kept in `AdminConnections`
when one is given, else on a connection of its own (`ask_once`).
"""

from __future__ import annotations

import ssl
import uuid
from typing import Any

from kvproxy.client.async_connections import AdminConnections, ask_once
from kvproxy.client.core import API_VERSIONS_VERSION, UpstreamError, api_versions_request
from kvproxy.client.partition_read import PartitionRead
from kvproxy.policies.topic_settings import ClusterSetting
from kvproxy.protocol import admin
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.messages import (
    API_VERSIONS,
    DESCRIBE_CONFIGS,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    PRODUCE,
)

_METADATA_VERSION = 1  # every broker since 0.10 answers it; enough for node ids and addresses


async def fetch_broker_addresses(
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    timeout: float,
    *,
    connections: AdminConnections | None = None,
) -> dict[int, tuple[str, int]]:
    """node id -> (host, port) of every broker the cluster names."""
    body = admin.metadata_request(_METADATA_VERSION, ())
    answer = await _ask(
        host,
        port,
        ssl_context,
        timeout,
        api_key=METADATA,
        version=_METADATA_VERSION,
        body=body,
        connections=connections,
    )
    return admin.brokers_of(answer)


async def list_topics(
    host: str, port: int, ssl_context: ssl.SSLContext | None, timeout: float
) -> list[str]:
    """The names of every topic the cluster has (Metadata v1 with no topic list: all)."""
    answer = await _ask(
        host,
        port,
        ssl_context,
        timeout,
        api_key=METADATA,
        version=_METADATA_VERSION,
        body=admin.metadata_request(_METADATA_VERSION, None),
    )
    return sorted(str(t.name) for t in answer.topics if int(t.error_code) in _EXISTS)


async def answers_api_versions(
    host: str, port: int, ssl_context: ssl.SSLContext | None, timeout: float
) -> bool:
    """Whether the server answers ApiVersions v0 with no error: it speaks Kafka, even where it
    serves nothing else before authentication."""
    try:
        answer = await _ask(
            host,
            port,
            ssl_context,
            timeout,
            api_key=API_VERSIONS,
            version=API_VERSIONS_VERSION,
            body=api_versions_request(),
        )
    except (OSError, TimeoutError, ProtocolError):
        return False
    return int(answer.error_code) == 0


_EXISTS = frozenset({0, 5})  # NONE, LEADER_NOT_AVAILABLE (the topic is there, electing a leader)
_ABSENT = frozenset({3, 17})  # UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC_EXCEPTION


async def topics_exist(
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    timeout: float,
    topics: list[str],
    *,
    connections: AdminConnections | None = None,
) -> dict[str, bool | None]:
    """topic -> whether the cluster has it (None when it answers another error, e.g. not
    authorized). Metadata v4 with `allow_auto_topic_creation` false: asking creates nothing."""
    body = admin.metadata_request(4, topics)
    answer = await _ask(
        host,
        port,
        ssl_context,
        timeout,
        api_key=METADATA,
        version=4,
        body=body,
        connections=connections,
    )
    found: dict[str, bool | None] = {}
    for entry in answer.topics:
        code = int(entry.error_code)
        found[str(entry.name)] = True if code in _EXISTS else False if code in _ABSENT else None
    return found


_METADATA_BY_ID_VERSION = 12
"""The first Metadata version that asks for topics by id (Kafka 3.1+; any broker offering
Produce v13 serves it)."""


async def topic_names_of(
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    timeout: float,
    topic_ids: list[uuid.UUID],
    *,
    connections: AdminConnections | None = None,
) -> dict[uuid.UUID, str]:
    """id -> name of the `topic_ids` the cluster knows (an id it does not is left out)."""
    answer = await _ask(
        host,
        port,
        ssl_context,
        timeout,
        api_key=METADATA,
        version=_METADATA_BY_ID_VERSION,
        body=admin.metadata_request_by_ids(_METADATA_BY_ID_VERSION, topic_ids),
        connections=connections,
    )
    return admin.metadata_topic_ids(answer)


_DESCRIBE_CONFIGS_VERSION = 1  # every broker since 1.1 answers it; Tansu serves 0-4


async def describe_topic_configs(
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    timeout: float,
    topics: list[str],
    *,
    connections: AdminConnections | None = None,
) -> dict[str, tuple[ClusterSetting, ...] | None]:
    """topic -> every setting the cluster reports for it, with its source (None when the
    cluster cannot describe the topic: an error, or no result for it)."""
    answer = await _ask(
        host,
        port,
        ssl_context,
        timeout,
        api_key=DESCRIBE_CONFIGS,
        version=_DESCRIBE_CONFIGS_VERSION,
        body=admin.describe_configs_request(_DESCRIBE_CONFIGS_VERSION, topics),
        connections=connections,
    )
    return described_topics(answer, topics)


def described_topics(
    answer: Any, topics: list[str]
) -> dict[str, tuple[ClusterSetting, ...] | None]:
    """A DescribeConfigs answer's settings of each of `topics` (None: not described); results
    for other names or resource types are ignored."""
    return {
        topic: None if configs is None else tuple(
            ClusterSetting(c.name, c.value, c.source) for c in configs
        )
        for topic, configs in admin.described_configs(answer, topics).items()
    }  # fmt: skip


async def _ask(
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    timeout: float,
    *,
    api_key: int,
    version: int,
    body: object,
    connections: AdminConnections | None = None,
) -> Any:
    """One request of kvproxy's own, on a connection of its own (or `connections`' kept one
    to that address): the decoded answer's body."""
    if connections is not None:
        return await connections.ask(
            host, port, timeout, api_key=api_key, version=version, body=body
        )
    return await ask_once(
        host, port, ssl_context, timeout, api_key=api_key, version=version, body=body
    )


async def partition_leader(
    bootstrap: list[tuple[str, int]],
    ssl_context: ssl.SSLContext | None,
    timeout: float,
    topic: str,
    partition: int,
) -> tuple[str, int] | None:
    """The address of `topic`-`partition`'s leader, asked of the first bootstrap that answers."""
    # v4+: ask without creating the topic (v1 would make a broker with auto-creation create it).
    body = admin.metadata_request(4, [topic])
    for host, port in bootstrap:
        try:
            answer = await _ask(
                host, port, ssl_context, timeout, api_key=METADATA, version=4, body=body
            )
        except (OSError, TimeoutError, ProtocolError):
            continue
        brokers = admin.brokers_of(answer)
        for entry in answer.topics:
            if entry.name != topic or int(entry.error_code) != 0:
                continue
            for p in entry.partitions:
                if int(p.partition_index) == partition and int(p.error_code) == 0:
                    return brokers.get(int(p.leader_id))
        return None
    return None


_PRODUCE_VERSION = 7  # magic-2 batches, zstd allowed, no flexible encoding: every broker since 2.1


async def produce_batch(
    leader: tuple[str, int],
    ssl_context: ssl.SSLContext | None,
    timeout: float,
    *,
    topic: str,
    partition: int,
    records: bytes,
) -> int:
    """Produce one partition's records with acks=-1; the broker's error code (0 = written)."""
    import datetime  # noqa: PLC0415

    from kio.schema.produce.v7.request import (  # noqa: PLC0415
        PartitionProduceData,
        ProduceRequest,
        TopicProduceData,
    )
    from kio.schema.types import TopicName  # noqa: PLC0415
    from kio.static.primitive import Records, i16, i32, i32Timedelta  # noqa: PLC0415

    body = ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=timeout)),
        topic_data=(
            TopicProduceData(
                name=TopicName(topic),
                partition_data=(
                    PartitionProduceData(index=i32(partition), records=Records(records)),
                ),
            ),
        ),
    )
    answer = await _ask(
        leader[0],
        leader[1],
        ssl_context,
        timeout,
        api_key=PRODUCE,
        version=_PRODUCE_VERSION,
        body=body,
    )
    return int(answer.responses[0].partition_responses[0].error_code)


_LIST_OFFSETS_VERSION = 1  # offsets by timestamp: every broker since 0.10.1


async def read_partition_since(
    leader: tuple[str, int],
    ssl_context: ssl.SSLContext | None,
    timeout: float,
    *,
    topic: str,
    partition: int,
    since_ms: int,
    max_bytes: int,
) -> tuple[int, bytes, bool]:
    """The records of `topic`-`partition` from the first whose batch's timestamp is at least
    `since_ms` up to the high watermark: (first offset, the records as fetched, whether the
    high watermark was reached within `max_bytes`). The first offset is -1 when no record is
    that recent. Raises `UpstreamError` on an error code."""
    asked = admin.list_offsets_request(
        _LIST_OFFSETS_VERSION, topic, {partition: since_ms}, timeout_s=timeout
    )
    listed = await _ask(
        leader[0],
        leader[1],
        ssl_context,
        timeout,
        api_key=LIST_OFFSETS,
        version=_LIST_OFFSETS_VERSION,
        body=asked,
    )
    found = admin.listed_offsets(listed, topic).get(partition)
    if found is None:
        raise ConnectionError(f"ListOffsets {topic}-{partition}: the broker answered no partition")
    code, first = found
    if code != 0:
        raise UpstreamError(f"ListOffsets {topic}-{partition}", code)
    if first < 0:
        return -1, b"", True
    read = PartitionRead(topic, partition, first, max_bytes)
    while (body := read.next_request()) is not None:
        answered = await _ask(
            leader[0],
            leader[1],
            ssl_context,
            timeout,
            api_key=FETCH,
            version=read.version,
            body=body,
        )
        read.receive(answered)
    return first, read.records, read.complete
