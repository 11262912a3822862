"""SASL/PLAIN passes through the proxy untouched.

Tansu 0.6 cannot authenticate PLAIN clients (tests/harness/sasl.md), so the upstream is the stub
cluster in SASL mode, and a recorded librdkafka exchange (tests/golden/sasl) is replayed through
the proxy byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvproxy.protocol.messages import API_VERSIONS, decode_response
from tests.harness.clients import sasl_plain_producer
from tests.harness.proxy import run_proxy
from tests.harness.raw_client import RawKafkaClient
from tests.harness.stub_upstream import run_stub_cluster

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "sasl"
INDEX = json.loads((GOLDEN / "index.json").read_text())
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


def test_plain_client_authenticates_and_produces_through_the_proxy() -> None:
    with (
        run_stub_cluster(sasl_plain={"alice": "secret"}) as cluster,
        run_proxy(cluster.bootstrap, max_brokers=10) as proxy,
    ):
        errors: list[Any] = []
        producer = sasl_plain_producer(proxy.bootstrap, "secret", errors)
        results: list[Any] = []
        producer.produce(
            "stub-topic", b"v", key=b"k", partition=2, on_delivery=lambda e, m: results.append(e)
        )
        assert producer.flush(10) == 0
        assert results == [None]
        assert errors == []
        # The leader of partition 2 (node 3) was reached through its proxy listener, and the
        # client authenticated there first.
        apis = [key for key, _, _ in cluster.requests(3)]
        assert apis[:3] == [API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE]
        assert cluster.produced(3) == 1


def test_wrong_password_reaches_the_client_as_an_authentication_error() -> None:
    from confluent_kafka import KafkaError

    with (
        run_stub_cluster(node_ids=(1,), sasl_plain={"alice": "secret"}) as cluster,
        run_proxy(cluster.bootstrap, max_brokers=10) as proxy,
    ):
        errors: list[Any] = []
        producer = sasl_plain_producer(proxy.bootstrap, "wrong", errors)
        producer.poll(2.0)
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors)
        assert any("Invalid username or password" in str(e) for e in errors)
        proxy.wait_until_idle()


@pytest.mark.parametrize("variant", ["ok", "bad-password"])
def test_recorded_exchange_passes_byte_for_byte(variant: str) -> None:
    """librdkafka's recorded SASL frames, replayed through the proxy, get the broker's own bytes;
    the ApiVersions answer is the broker's, trimmed."""
    users = {INDEX["user"]: INDEX["password"]}
    with (
        run_stub_cluster(node_ids=(1,), sasl_plain=users) as cluster,
        run_proxy(cluster.bootstrap, max_brokers=10) as proxy,
        RawKafkaClient(proxy.host, proxy.port) as client,
    ):
        for entry in INDEX[variant]:
            request = (GOLDEN / f"{entry['file']}.request.bin").read_bytes()
            expected = (GOLDEN / f"{entry['file']}.response.bin").read_bytes()
            answer = client.request(request)
            if entry["api_key"] == API_VERSIONS:
                version = entry["api_version"]
                offered = decode_response(answer, API_VERSIONS, version).body.api_keys
                original = decode_response(expected, API_VERSIONS, version).body.api_keys
                assert {a.api_key for a in offered} <= {a.api_key for a in original}
                assert SASL_HANDSHAKE in {a.api_key for a in offered}
            else:
                assert answer == expected, entry["file"]
        if variant == "bad-password":
            assert client.is_closed_by_peer(timeout=2)
        # Every frame of the client reached the broker unchanged (the proxy's own Metadata
        # request at start, refused before authentication, is not the client's).
        recorded = [(GOLDEN / f"{e['file']}.request.bin").read_bytes() for e in INDEX[variant]]
        received = [request for request, _ in cluster.frames(1) if b"kvproxy-golden" in request]
        assert received == recorded
