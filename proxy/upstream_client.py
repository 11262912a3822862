"""The proxy's own requests to the cluster: where brokers live, what topics are set to."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from kio.schema.metadata.v1.request import MetadataRequest

from policies.topic_settings import ClusterSetting
from protocol.errors import ProtocolError
from protocol.framing import FrameDecoder, frame
from protocol.messages import METADATA, decode_response, encode_request, make_request
from proxy.fds import describe as describe_fd_shortage
from proxy.fds import out_of_fds


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
    host: str, port: int, ssl_context: ssl.SSLContext | None, timeout: float
) -> dict[int, tuple[str, int]]:
    """node id -> (host, port) of every broker the cluster names."""
    body = MetadataRequest(topics=())
    payload = await _round_trip(
        host, port, ssl_context, timeout, api_key=METADATA, version=_METADATA_VERSION, body=body
    )
    answer = decode_response(payload, METADATA, _METADATA_VERSION).body
    return {int(b.node_id): (b.host, int(b.port)) for b in answer.brokers}


async def list_topics(
    host: str, port: int, ssl_context: ssl.SSLContext | None, timeout: float
) -> list[str]:
    """The names of every topic the cluster has (Metadata v1 with no topic list: all)."""
    payload = await _round_trip(
        host,
        port,
        ssl_context,
        timeout,
        api_key=METADATA,
        version=_METADATA_VERSION,
        body=MetadataRequest(topics=None),
    )
    answer = decode_response(payload, METADATA, _METADATA_VERSION).body
    return sorted(str(t.name) for t in answer.topics if int(t.error_code) in _EXISTS)


async def answers_api_versions(
    host: str, port: int, ssl_context: ssl.SSLContext | None, timeout: float
) -> bool:
    """Whether the server answers ApiVersions v0 with no error: it speaks Kafka, even where it
    serves nothing else before authentication."""
    from kio.schema.api_versions.v0.request import ApiVersionsRequest  # noqa: PLC0415

    from protocol.messages import API_VERSIONS  # noqa: PLC0415

    try:
        payload = await _round_trip(
            host, port, ssl_context, timeout, api_key=API_VERSIONS, version=0,
            body=ApiVersionsRequest(),
        )  # fmt: skip
        answer = decode_response(payload, API_VERSIONS, 0).body
    except (OSError, TimeoutError, ProtocolError):
        return False
    return int(answer.error_code) == 0


_EXISTS = frozenset({0, 5})  # NONE, LEADER_NOT_AVAILABLE (the topic is there, electing a leader)
_ABSENT = frozenset({3, 17})  # UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC_EXCEPTION


async def topics_exist(
    host: str, port: int, ssl_context: ssl.SSLContext | None, timeout: float, topics: list[str]
) -> dict[str, bool | None]:
    """topic -> whether the cluster has it (None when it answers another error, e.g. not
    authorized). Metadata v4 with `allow_auto_topic_creation` false: asking creates nothing."""
    from kio.schema.metadata.v4.request import MetadataRequest as MetadataRequestV4  # noqa: PLC0415
    from kio.schema.metadata.v4.request import MetadataRequestTopic  # noqa: PLC0415
    from kio.schema.types import TopicName  # noqa: PLC0415

    body = MetadataRequestV4(
        topics=tuple(MetadataRequestTopic(name=TopicName(topic)) for topic in topics),
        allow_auto_topic_creation=False,
    )
    payload = await _round_trip(
        host, port, ssl_context, timeout, api_key=METADATA, version=4, body=body
    )
    found: dict[str, bool | None] = {}
    for entry in decode_response(payload, METADATA, 4).body.topics:
        code = int(entry.error_code)
        found[str(entry.name)] = True if code in _EXISTS else False if code in _ABSENT else None
    return found


_DESCRIBE_CONFIGS_VERSION = 1  # every broker since 1.1 answers it; Tansu serves 0-4
_TOPIC_RESOURCE = 2


async def describe_topic_configs(
    host: str, port: int, ssl_context: ssl.SSLContext | None, timeout: float, topics: list[str]
) -> dict[str, tuple[ClusterSetting, ...] | None]:
    """topic -> every setting the cluster reports for it, with its source (None when the
    cluster cannot describe the topic: an error, or no result for it)."""
    from kio.schema.describe_configs.v1.request import (  # noqa: PLC0415
        DescribeConfigsRequest,
        DescribeConfigsResource,
    )
    from kio.static.primitive import i8  # noqa: PLC0415

    from protocol.messages import DESCRIBE_CONFIGS  # noqa: PLC0415

    body = DescribeConfigsRequest(
        resources=tuple(
            DescribeConfigsResource(
                resource_type=i8(_TOPIC_RESOURCE),
                resource_name=topic,
                configuration_keys=None,  # all: Tansu drops the connection when keys are named
            )
            for topic in topics
        ),
        include_synonyms=False,
    )
    payload = await _round_trip(
        host,
        port,
        ssl_context,
        timeout,
        api_key=DESCRIBE_CONFIGS,
        version=_DESCRIBE_CONFIGS_VERSION,
        body=body,
    )
    answer = decode_response(payload, DESCRIBE_CONFIGS, _DESCRIBE_CONFIGS_VERSION).body
    return described_topics(answer, topics)


def described_topics(
    answer: Any, topics: list[str]
) -> dict[str, tuple[ClusterSetting, ...] | None]:
    """A DescribeConfigs answer's settings of each of `topics` (None: not described); results
    for other names or resource types are ignored."""
    described: dict[str, tuple[ClusterSetting, ...] | None] = {topic: None for topic in topics}
    for result in answer.results:
        if int(result.resource_type) != _TOPIC_RESOURCE:
            continue
        name = str(result.resource_name)
        if int(result.error_code) != 0 or name not in described:
            continue
        described[name] = tuple(
            ClusterSetting(str(entry.name), entry.value, int(getattr(entry, "config_source", -1)))
            for entry in result.configs
        )
    return described


async def _round_trip(
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    timeout: float,
    *,
    api_key: int,
    version: int,
    body: object,
) -> bytes:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            host, port, ssl=ssl_context, server_hostname=host if ssl_context else None
        ),
        timeout,
    )
    try:
        writer.write(frame(encode_request(make_request(api_key, version, 1, "kvproxy", body))))
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
    from kio.schema.metadata.v4.request import MetadataRequest as MetadataRequestV4  # noqa: PLC0415
    from kio.schema.metadata.v4.request import MetadataRequestTopic  # noqa: PLC0415
    from kio.schema.types import TopicName  # noqa: PLC0415

    # v4+: ask without creating the topic (v1 would make a broker with auto-creation create it).
    body = MetadataRequestV4(
        topics=(MetadataRequestTopic(name=TopicName(topic)),), allow_auto_topic_creation=False
    )
    for host, port in bootstrap:
        try:
            payload = await _round_trip(
                host, port, ssl_context, timeout, api_key=METADATA, version=4, body=body
            )
        except (OSError, TimeoutError, ProtocolError):
            continue
        answer = decode_response(payload, METADATA, 4).body
        brokers = {int(b.node_id): (b.host, int(b.port)) for b in answer.brokers}
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

    from protocol.messages import PRODUCE  # noqa: PLC0415

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
    payload = await _round_trip(
        leader[0],
        leader[1],
        ssl_context,
        timeout,
        api_key=PRODUCE,
        version=_PRODUCE_VERSION,
        body=body,
    )
    answer = decode_response(payload, PRODUCE, _PRODUCE_VERSION).body
    return int(answer.responses[0].partition_responses[0].error_code)
