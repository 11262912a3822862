"""Self-tests of the test harness (Tansu runner, raw client, recording relay)."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness import (
    Broker,
    RawClientError,
    RawKafkaClient,
    TansuError,
    api_versions_v0_request,
    parse_api_versions_v0_response,
    run_tansu,
)
from tests.harness.capture import read_produce_request, recording_tansu

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
MAGIC0_FRAME = GOLDEN / "kafka-python-produce-v1-magic0.bin"


def _api_versions_ok(host: str, port: int) -> bool:
    with RawKafkaClient(host, port) as c:
        _, error_code, apis = parse_api_versions_v0_response(c.request(api_versions_v0_request()))
    return error_code == 0 and 0 in apis


def test_tansu_fixture_answers(tansu: Broker) -> None:
    assert tansu.host == "127.0.0.1"
    assert tansu.bootstrap == f"127.0.0.1:{tansu.port}"
    assert _api_versions_ok(tansu.host, tansu.port)


def test_make_topic_creates_partitions(tansu: Broker, make_topic: Callable[..., str]) -> None:
    from confluent_kafka.admin import AdminClient

    name = make_topic(partitions=3)
    md = AdminClient({"bootstrap.servers": tansu.bootstrap}).list_topics(name, timeout=5)
    assert len(md.topics[name].partitions) == 3


def test_topic_fixture_is_unique(topic: str, make_topic: Callable[..., str]) -> None:
    assert topic != make_topic()


def test_run_tansu_restart_keeps_port() -> None:
    with run_tansu() as server:
        port = server.port
        server.restart()
        assert server.running
        assert server.port == port
        assert _api_versions_ok(server.host, server.port)
        assert "listening on" in server.log_text()
    assert not server.running


def test_run_tansu_reports_startup_failure() -> None:
    with pytest.raises(TansuError, match="exited with code") as info:  # noqa: SIM117
        with run_tansu(extra_args=("--no-such-flag",)):
            pass
    assert "no-such-flag" in str(info.value)


def test_raw_client_timeout_is_clear(raw_client: RawKafkaClient) -> None:
    with pytest.raises(RawClientError, match="timed out"):
        raw_client.recv_frame(timeout=0.2)
    assert not raw_client.is_closed_by_peer(timeout=0.2)


def test_raw_client_sees_broker_close(raw_client: RawKafkaClient) -> None:
    # Tansu drops connections that carry magic 0/1 message sets.
    raw_client.send_frame(MAGIC0_FRAME.read_bytes())
    assert raw_client.is_closed_by_peer(timeout=5)
    with pytest.raises(RawClientError, match=r"closed|reset"):
        raw_client.recv_frame(timeout=1)


def test_relay_records_and_forwards_unchanged() -> None:
    with recording_tansu() as (relay, server):
        assert server.advertised_port == relay.port
        request = api_versions_v0_request(correlation_id=7, client_id="relay-test")
        with RawKafkaClient(relay.host, relay.port) as c:
            response = c.request(request)
            # a second request pipelined in two pieces still yields whole frames
            second = api_versions_v0_request(correlation_id=8)
            framed = struct.pack(">i", len(second)) + second
            c.send_raw(framed[:3])
            time.sleep(0.05)
            c.send_raw(framed[3:])
            c.recv_frame()
            time.sleep(0.05)
        assert parse_api_versions_v0_response(response)[:2] == (7, 0)
        reqs = relay.requests()
        assert [f.payload for f in reqs] == [request, second]
        assert [f.correlation_id for f in reqs] == [7, 8]
        assert relay.responses()[0].payload == response


def test_relay_propagates_broker_close() -> None:
    with (
        recording_tansu() as (relay, _server),
        RawKafkaClient(relay.host, relay.port) as c,
    ):
        c.send_frame(MAGIC0_FRAME.read_bytes())
        assert c.is_closed_by_peer(timeout=5)
        assert relay.requests(api_key=0)[0].payload == MAGIC0_FRAME.read_bytes()


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*-produce-v*.bin")), ids=lambda p: p.stem)
def test_harness_produce_reader_matches_sidecars(path: Path) -> None:
    summary = read_produce_request(path.read_bytes())
    expected = json.loads(path.with_suffix(".json").read_text())
    assert summary.api_version == expected["api_version"]
    assert summary.acks == expected["acks"]
    got = {(t, str(p)) for t, p, _ in summary.partitions}
    want = {(t, p) for t, parts in expected["topics"].items() for p in parts}
    assert got == want


def test_relay_captures_a_real_client_produce() -> None:
    from confluent_kafka import Producer

    with recording_tansu() as (relay, _server):
        producer = Producer({"bootstrap.servers": relay.bootstrap, "linger.ms": 5})
        reports: list[object] = []
        for i in range(3):
            producer.produce(
                "relayed",
                key=b"k%d" % i,
                value=b"v%d" % i,
                partition=0,
                on_delivery=lambda err, _msg: reports.append(err),
            )
        assert producer.flush(10) == 0
        assert reports == [None, None, None]
        del producer  # disconnect before the relay goes away
        produce = relay.requests(api_key=0)
    assert produce, "the client bypassed the relay"
    summary = read_produce_request(produce[0].payload)
    assert summary.partitions[0][:2] == ("relayed", 0)
    assert summary.client_id == "rdkafka"
