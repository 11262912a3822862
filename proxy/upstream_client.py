"""The proxy's own requests to the cluster: where brokers live, what topics are set to."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from kvproxy.policies.topic_settings import ClusterSetting
from kvproxy.protocol import admin
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.framing import FrameDecoder
from kvproxy.protocol.messages import (
    DESCRIBE_CONFIGS,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    decode_response,
)
from kvproxy.proxy.admin_connections import AdminConnections
from kvproxy.proxy.fds import describe as describe_fd_shortage
from kvproxy.proxy.fds import out_of_fds


def describe_failure(exc: BaseException, timeout_s: float) -> str:
    """Why a request to the cluster failed, in words: never empty (a timeout's own text is)."""
    if isinstance(exc, TimeoutError):
        return (
            f"no answer within upstream.connect_timeout_ms ({timeout_s * 1000:.0f} ms): the "
            "address accepts nothing, or the peer does not answer Kafka requests"
        )
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)"
    if out_of_fds(exc):  # the proxy's own shortage, not the broker's
        return describe_fd_shortage(exc)
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed: {exc.reason or exc}"
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ProtocolError):
        return f"the answer is not Kafka's: {text}"
    return text


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
    from kio.schema.api_versions.v0.request import ApiVersionsRequest  # noqa: PLC0415

    from kvproxy.protocol.messages import API_VERSIONS  # noqa: PLC0415

    try:
        answer = await _ask(
            host,
            port,
            ssl_context,
            timeout,
            api_key=API_VERSIONS,
            version=0,
            body=ApiVersionsRequest(),
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
    frame = admin.request_frame(api_key, version, 1, "kvproxy", body)
    payload = await _round_trip(host, port, ssl_context, timeout, frame)
    return decode_response(payload, api_key, version).body


async def _round_trip(
    host: str, port: int, ssl_context: ssl.SSLContext | None, timeout: float, frame: bytes
) -> bytes:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            host, port, ssl=ssl_context, server_hostname=host if ssl_context else None
        ),
        timeout,
    )
    try:
        writer.write(frame)
        await writer.drain()
        decoder = FrameDecoder()
        while (payload := decoder.next_frame()) is None:
            chunk = await asyncio.wait_for(reader.read(65536), timeout)
            if not chunk:
                raise ConnectionError(f"{host}:{port} closed the connection")
            decoder.receive_data(chunk)
        return bytes(payload)
    finally:
        writer.close()


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

    from kvproxy.protocol.messages import PRODUCE  # noqa: PLC0415

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


class UpstreamError(Exception):
    """The broker answered a request of the proxy's own with an error code."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what}: error {code}")
        self.code = code


_LIST_OFFSETS_VERSION = 1  # offsets by timestamp: every broker since 0.10.1
_FETCH_VERSION = 4  # magic-2 records by topic name: every broker since 0.11


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
    from kvproxy.protocol.records import iter_batches  # noqa: PLC0415

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
    out = bytearray()
    offset = first
    high_watermark: int | None = None
    while high_watermark is None or offset < high_watermark:
        if len(out) >= max_bytes:
            return first, bytes(out), False
        body = admin.fetch_request(
            _FETCH_VERSION,
            topic,
            {partition: offset},
            max_bytes=max_bytes - len(out),
            min_bytes=0,
            # not 0: Tansu answers a Fetch that may not wait with no partition at all
            max_wait_ms=100,
        )
        answered = await _ask(
            leader[0],
            leader[1],
            ssl_context,
            timeout,
            api_key=FETCH,
            version=_FETCH_VERSION,
            body=body,
        )
        fetched = admin.fetched_partitions(answered, topic).get(partition)
        if fetched is None:
            raise ConnectionError(f"Fetch {topic}-{partition}: the broker answered no partition")
        if fetched.error_code != 0:
            raise UpstreamError(f"Fetch {topic}-{partition}", fetched.error_code)
        if high_watermark is None:
            high_watermark = fetched.high_watermark
        records = fetched.records
        next_offset = offset
        for batch in iter_batches(records, allow_partial_tail=True):
            next_offset = max(next_offset, batch.base_offset + batch.last_offset_delta + 1)
            out += batch.buffer
        if next_offset == offset:
            # nothing whole came back: the next batch is larger than what is left to read
            return first, bytes(out), offset >= high_watermark
        offset = next_offset
    return first, bytes(out), True
