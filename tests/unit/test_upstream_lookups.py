"""The proxy's own requests about client-chosen names: one kept connection per address, many
names per request, a bounded cache of names the cluster cannot describe, a budget per client."""

from __future__ import annotations

import asyncio
import struct

import pytest

from kvproxy.client.async_connections import AdminConnections
from kvproxy.client.async_requests import fetch_broker_addresses
from kvproxy.policies.api import TopicConfig
from kvproxy.policies.topic_settings import ClusterSetting
from kvproxy.protocol.framing import frame
from kvproxy.protocol.messages import METADATA, encode_response, make_response, read_request
from kvproxy.proxy.config.proxy_config import TopicConfigsConfig
from kvproxy.proxy.lookups import topic_configs
from kvproxy.proxy.lookups.budget import ClientLookupBudget
from kvproxy.proxy.lookups.topic_configs import TopicConfigCache

HOST = "127.0.0.1"


class Client:
    """A client connection, as the budget sees it (weakly referenced)."""


def _metadata_answer(request: bytes) -> bytes:
    """A Metadata v1 answer naming one broker, to the request `request` (its correlation id)."""
    from kio.schema.metadata.v1.response import MetadataResponse, MetadataResponseBroker
    from kio.schema.types import BrokerId
    from kio.static.primitive import i32

    parsed = read_request(request, 0)[0]
    body = MetadataResponse(
        brokers=(
            MetadataResponseBroker(node_id=BrokerId(7), host="b7", port=i32(9092), rack=None),
        ),
        controller_id=BrokerId(7),
        topics=(),
    )
    cid = int(parsed.header.correlation_id)
    return frame(encode_response(METADATA, 1, make_response(METADATA, 1, cid, body)))


async def _broker(close_after_answer: bool) -> tuple[asyncio.Server, list[int]]:
    """A loopback server answering Metadata v1; counts the connections it accepted."""
    accepted: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                writer.write(_metadata_answer(await reader.readexactly(size)))
                await writer.drain()
                if close_after_answer:
                    break
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0), accepted


async def test_requests_to_one_address_share_one_kept_connection() -> None:
    server, accepted = await _broker(close_after_answer=False)
    port = server.sockets[0].getsockname()[1]
    connections = AdminConnections(None)
    try:
        for _ in range(20):
            nodes = await fetch_broker_addresses(
                "127.0.0.1", port, None, 5, connections=connections
            )
            assert nodes == {7: ("b7", 9092)}
        assert len(accepted) == 1 and connections.opened == 1
    finally:
        connections.close()
        server.close()


async def test_a_kept_connection_the_broker_closed_is_opened_again_and_the_request_answered() -> (
    None
):
    server, accepted = await _broker(close_after_answer=True)
    port = server.sockets[0].getsockname()[1]
    connections = AdminConnections(None)
    try:
        for _ in range(3):
            nodes = await fetch_broker_addresses(
                "127.0.0.1", port, None, 5, connections=connections
            )
            assert nodes == {7: ("b7", 9092)}
        assert len(accepted) == 3 and connections.opened == 3
    finally:
        connections.close()
        server.close()


async def test_names_asked_together_go_in_few_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """250 clients each asking about one new name: 3 DescribeConfigs of at most 100 names
    (`max_topics_per_request`), not 250."""
    asked: list[list[str]] = []

    async def describe(
        host: str, port: int, context: object, timeout: float, topics: list[str]
    ) -> dict[str, tuple[ClusterSetting, ...] | None]:
        asked.append(list(topics))
        await asyncio.sleep(0)
        return dict.fromkeys(topics)

    monkeypatch.setattr(topic_configs, "describe_topic_configs", describe)
    cache = TopicConfigCache(
        lambda: [("h", 1)],
        None,
        ttl_s=60,
        timeout_s=1,
        settings=TopicConfigsConfig(lookup_requests_per_second=1000),
    )
    names = [f"name-{n}" for n in range(250)]
    await asyncio.gather(*(cache.refresh([name]) for name in names))
    assert sorted(n for batch in asked for n in batch) == sorted(names)
    assert len(asked) <= 3 and all(len(batch) <= 100 for batch in asked), [len(b) for b in asked]
    assert all(cache.known(name) for name in names)


def test_names_the_cluster_cannot_describe_never_evict_described_topics() -> None:
    cache = TopicConfigCache(lambda: [], None, ttl_s=60, timeout_s=1, max_topics=100)
    learned = TopicConfig(compacted=True)
    cache.put("orders", learned)
    for n in range(20_000):
        cache.put(f"invented-{n}", None)
    assert cache.config("orders") is learned
    assert len(cache._unknown) == TopicConfigsConfig().max_absent_topics == 10_000
    assert cache.known("invented-19999") and not cache.known("invented-0")


def test_each_client_has_a_burst_then_a_rate_of_new_names() -> None:
    now = [0.0]
    budget = ClientLookupBudget(per_second=10, burst=100, clock=lambda: now[0])
    hostile, other = Client(), Client()
    assert budget.grant(hostile, 150) == 100
    assert budget.grant(hostile, 5) == 0
    assert budget.grant(other, 5) == 5  # another connection's budget is its own
    now[0] = 0.5
    assert budget.grant(hostile, 50) == 5
    now[0] = 1000.0
    assert budget.grant(hostile, 500) == 100  # never more than the burst


def test_names_beyond_a_clients_budget_are_decided_unknown_and_counted() -> None:
    counted: dict[str, int] = {}
    cache = TopicConfigCache(
        lambda: [],
        None,
        ttl_s=60,
        timeout_s=1,
        settings=TopicConfigsConfig(lookups_per_client_per_second=1, max_topics_per_request=3),
        count=lambda outcome, n: counted.__setitem__(outcome, counted.get(outcome, 0) + n),
    )
    client = Client()
    assert cache.admit(["a", "b", "c", "d", "e"], client) == ["a", "b", "c"]
    assert counted == {"asked": 3, "client_rate": 2}
    assert cache.admit(["a", "b"], None) == ["a", "b"]  # no client: no per-client bound


def test_a_reload_applies_the_new_lookup_bounds() -> None:
    cache = TopicConfigCache(lambda: [], None, ttl_s=60, timeout_s=1)
    client = Client()
    cache.settings = TopicConfigsConfig(lookups_per_client_per_second=1, max_topics_per_request=2)
    assert cache.admit(["a", "b", "c"], client) == ["a", "b"]
    assert cache.ttl_s == TopicConfigsConfig().ttl_ms / 1000
