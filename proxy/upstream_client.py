"""The proxy's own requests to the cluster: where brokers live, how topics are cleaned up."""

from __future__ import annotations

import asyncio
import ssl

from kio.schema.metadata.v1.request import MetadataRequest

from protocol.framing import FrameDecoder, frame
from protocol.messages import METADATA, decode_response, encode_request, make_request

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


_DESCRIBE_CONFIGS_VERSION = 1  # every broker since 1.1 answers it; Tansu serves 0-4
_TOPIC_RESOURCE = 2
CLEANUP_POLICY = "cleanup.policy"


async def describe_cleanup_policies(
    host: str, port: int, ssl_context: ssl.SSLContext | None, timeout: float, topics: list[str]
) -> dict[str, str | None]:
    """topic -> its cleanup.policy ("delete" when unset; None when the cluster cannot say)."""
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
    policies: dict[str, str | None] = {topic: None for topic in topics}
    for result in answer.results:
        if int(result.error_code) != 0:
            continue
        policies[result.resource_name] = "delete"  # Kafka's default when the topic sets none
        for entry in result.configs:
            if entry.name == CLEANUP_POLICY:
                policies[result.resource_name] = entry.value
    return policies


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
        return payload
    finally:
        writer.close()
