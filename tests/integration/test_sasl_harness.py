"""SASL test support: the stub upstream's SASL/PLAIN mode and the recorded librdkafka exchange.

Tansu 0.6 cannot be used for SASL tests (see tests/harness/sasl.md): no PLAIN, and SCRAM users
cannot be stored. The stub stands in, and tests/golden/sasl/ keeps a real client's frames.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.harness.clients import sasl_plain_producer
from tests.harness.raw_client import RawKafkaClient
from tests.harness.stub_upstream import run_stub_cluster

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "sasl"
INDEX = json.loads((GOLDEN / "index.json").read_text())


def test_librdkafka_plain_produces_after_auth() -> None:
    with run_stub_cluster(sasl_plain={"alice": "secret"}) as cluster:
        errors: list[Any] = []
        producer = sasl_plain_producer(cluster.bootstrap, "secret", errors)
        results: list[Any] = []
        producer.produce(
            "stub-topic", b"v", key=b"k", partition=2, on_delivery=lambda e, m: results.append(e)
        )
        assert producer.flush(5) == 0
        assert results == [None]
        assert errors == []
        apis = [key for key, _, _ in cluster.requests(3)]
        assert apis[:3] == [18, 17, 36]
        assert 0 in apis


def test_librdkafka_wrong_password_fails() -> None:
    from confluent_kafka import KafkaError

    with run_stub_cluster(node_ids=(1,), sasl_plain={"alice": "secret"}) as cluster:
        errors: list[Any] = []
        producer = sasl_plain_producer(cluster.bootstrap, "wrong", errors)
        producer.poll(1.0)
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors)
        assert "Invalid username or password" in str(errors[0])
        assert all(key in (17, 18, 36) for key, _, _ in cluster.requests(1))


def test_request_before_auth_closes_connection() -> None:
    import struct

    with run_stub_cluster(node_ids=(1,), sasl_plain={"alice": "secret"}) as cluster:
        host, port = cluster.nodes[1]
        with RawKafkaClient(host, port) as c:
            c.send_frame(struct.pack(">hhih", 3, 1, 7, 1) + b"x" + struct.pack(">i", -1))
            assert c.is_closed_by_peer(timeout=2)


@pytest.mark.parametrize("variant", ["ok", "bad-password"])
def test_golden_exchange_replays_byte_for_byte(variant: str) -> None:
    """The recorded requests, replayed on one connection, get the recorded answers back."""
    with run_stub_cluster(node_ids=(1,), sasl_plain={INDEX["user"]: INDEX["password"]}) as c:
        host, port = c.nodes[1]
        with RawKafkaClient(host, port) as client:
            for entry in INDEX[variant]:
                request = (GOLDEN / f"{entry['file']}.request.bin").read_bytes()
                expected = (GOLDEN / f"{entry['file']}.response.bin").read_bytes()
                assert client.request(request) == expected, entry["file"]
            if variant == "bad-password":
                assert client.is_closed_by_peer(timeout=2)


def test_golden_plain_token() -> None:
    """SaslAuthenticate v1 carries the RFC 4616 token: authzid NUL user NUL password."""
    import struct

    entry = INDEX["ok"][-1]
    assert (entry["api_key"], entry["api_version"]) == (36, 1)
    request = (GOLDEN / f"{entry['file']}.request.bin").read_bytes()
    (n,) = struct.unpack_from(">h", request, 8)
    (size,) = struct.unpack_from(">i", request, 10 + n)
    token = request[14 + n : 14 + n + size]
    assert token == b"\x00" + INDEX["user"].encode() + b"\x00" + INDEX["password"].encode()
