"""A client connection and its upstream side on in-memory transports: a Produce request's path
through the proxy without sockets (the broker's answer is fed as bytes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from kvproxy.protocol.framing import size_prefix
from kvproxy.protocol.messages import PRODUCE, encode_response, make_response
from kvproxy.protocol.produce import partition_answer, produce_answer, produce_response_types
from kvproxy.protocol.records import build_batch
from kvproxy.proxy.relay.client_connection import ClientConnection
from kvproxy.proxy.relay.upstream_connection import UpstreamConnection
from kvproxy.proxy.serve.server import ProxyServer
from tests.harness.fuzz import produce_request as produce_payload
from tests.harness.proxy import proxy_config

TOPIC = "orders"


class Transport:
    """Keeps what is written; reading and closing do nothing."""

    def __init__(self) -> None:
        self.written = bytearray()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40_000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.written += part

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


class ConnectionPair:
    """A client connection and its upstream side, both on in-memory transports."""

    def __init__(self, server: ProxyServer) -> None:
        self.server = server
        self.client = ClientConnection(server.connection_state, None)
        self.to_client = Transport()
        self.to_broker = Transport()
        self.client.transport = self.to_client  # type: ignore[assignment]
        self.upstream = UpstreamConnection(self.client, 1 << 20, 1 << 20)
        self.upstream.connection_made(self.to_broker)  # type: ignore[arg-type]
        self.client.upstream = self.upstream

    def request(self, payload: bytes) -> None:
        self._feed(self.client, size_prefix(payload) + payload)

    def answer(self, payload: bytes) -> None:
        self._feed(self.upstream, size_prefix(payload) + payload)

    @staticmethod
    def _feed(side: Any, data: bytes) -> None:
        buffer = side.get_buffer(len(data))
        buffer[: len(data)] = data
        side.buffer_updated(len(data))


@contextlib.contextmanager
def connection_pair() -> Iterator[ConnectionPair]:
    """A pair on a proxy whose topic `TOPIC` is known (nothing to describe or ask first), with
    its own event loop set as the current one (nothing runs it)."""
    config = proxy_config("127.0.0.1:1", metrics={"enabled": False})
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        server = ProxyServer(config)
        server.topic_configs.put(TOPIC, False, ttl_s=3600)
        server.metrics.topic_labels.seen([TOPIC])
        yield ConnectionPair(server)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def produce_request(version: int, correlation_id: int) -> bytes:
    """One record of 100 bytes for partition 0 of `TOPIC`."""
    batch = build_batch([(b"k", b"v" * 100, None, None)])
    return produce_payload(version, correlation_id, [(TOPIC, 0, batch)])


def produce_answer_ok(version: int, correlation_id: int) -> bytes:
    """The broker's answer to `produce_request`: partition 0 written at offset 0."""
    types = produce_response_types(version)
    body = produce_answer(types, [(TOPIC, [partition_answer(types, 0, 0)])])
    return encode_response(PRODUCE, version, make_response(PRODUCE, version, correlation_id, body))
