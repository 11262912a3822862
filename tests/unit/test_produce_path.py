"""A Produce request's path through one client connection, without sockets: the request is read
once, and the broker's answer reaches the client as the broker wrote it when the proxy refused
nothing (the per-request work of a small request is most of what the proxy adds)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from kvproxy.protocol import messages
from kvproxy.protocol.framing import size_prefix
from kvproxy.protocol.messages import PRODUCE, encode_response, make_response
from kvproxy.protocol.produce import partition_answer, produce_answer, produce_response_types
from kvproxy.protocol.records import build_batch
from kvproxy.proxy import partition_limit, rewrite
from kvproxy.proxy.connection import ClientConnection
from kvproxy.proxy.server import ProxyServer
from kvproxy.proxy.upstream_connection import UpstreamConnection
from tests.harness.fuzz import produce_request as produce_payload
from tests.harness.proxy import proxy_config

TOPIC = "orders"


class _Transport:
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


class _Pair:
    """A client connection and its upstream side, both on in-memory transports."""

    def __init__(self, server: ProxyServer) -> None:
        self.client = ClientConnection(server.connection_state, None)
        self.to_client = _Transport()
        self.to_broker = _Transport()
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


@pytest.fixture
def pair() -> Iterator[_Pair]:
    config = proxy_config("127.0.0.1:1", metrics={"enabled": False})
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        server = ProxyServer(config)
        server.topic_configs.put(TOPIC, False, ttl_s=3600)  # nothing to describe first
        server.metrics.topic_labels.seen([TOPIC])  # nothing to ask before counting
        yield _Pair(server)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def _request(version: int, correlation_id: int) -> bytes:
    batch = build_batch([(b"k", b"v" * 100, None, None)])
    return produce_payload(version, correlation_id, [(TOPIC, 0, batch)])


def _answer(version: int, correlation_id: int) -> bytes:
    types = produce_response_types(version)
    body = produce_answer(types, [(TOPIC, [partition_answer(types, 0, 0)])])
    return encode_response(PRODUCE, version, make_response(PRODUCE, version, correlation_id, body))


@pytest.mark.parametrize("version", [3, 9, 12])
def test_a_forwarded_produce_request_is_read_once(
    pair: _Pair, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    reads: list[str] = []
    for module, name in [
        (partition_limit, "read_produce"),
        (partition_limit, "scan_produce"),  # the partition count alone
        (messages, "read_request"),  # the codec, wherever it is called from
    ]:
        original = getattr(module, name)

        def counted(*args: Any, _original: Any = original, _name: str = name) -> Any:
            reads.append(_name)
            return _original(*args)

        monkeypatch.setattr(module, name, counted)
    payload = _request(version, 5)
    pair.request(payload)
    assert bytes(pair.to_broker.written) == size_prefix(payload) + payload  # forwarded as sent
    assert reads == ["read_produce"]


@pytest.mark.parametrize("version", [9, 10, 12])
def test_the_brokers_answer_reaches_the_client_unchanged_when_nothing_was_refused(
    pair: _Pair, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    def no_decoding(*_args: object) -> None:
        raise AssertionError("the answer was decoded")

    monkeypatch.setattr(rewrite, "decode_response", no_decoding)
    pair.request(_request(version, 5))
    answer = _answer(version, 5)
    pair.answer(answer)
    assert bytes(pair.to_client.written) == size_prefix(answer) + answer
