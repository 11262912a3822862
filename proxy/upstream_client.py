"""The proxy's own requests to the cluster (today: Metadata, to learn where brokers live)."""

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
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            host, port, ssl=ssl_context, server_hostname=host if ssl_context else None
        ),
        timeout,
    )
    try:
        request = make_request(
            METADATA, _METADATA_VERSION, 1, "kvproxy", MetadataRequest(topics=())
        )
        writer.write(frame(encode_request(request)))
        await writer.drain()
        decoder = FrameDecoder()
        while (payload := decoder.next_frame()) is None:
            chunk = await asyncio.wait_for(reader.read(65536), timeout)
            if not chunk:
                raise ConnectionError(f"{host}:{port} closed the connection")
            decoder.receive_data(chunk)
    finally:
        writer.close()
    body = decode_response(payload, METADATA, _METADATA_VERSION).body
    return {int(b.node_id): (b.host, int(b.port)) for b in body.brokers}
