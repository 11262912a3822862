"""A broken or hostile broker: an answer naming a broker with a negative node id at its own
host, or more brokers than any cluster has. No answer a client gets carries that host; an
answer beyond `MAX_NODES_PER_ANSWER` closes the asking client's connection (the proxy's own
refresh counts it as failed and keeps the brokers it knows), and is checked off the event
loop, so other clients are answered meanwhile."""

from __future__ import annotations

import logging
import struct
import threading
from typing import Any

import pytest

from kvproxy.protocol.admin import MAX_NODES_PER_ANSWER
from kvproxy.protocol.messages import API_VERSIONS, METADATA, decode_response
from tests.harness.metrics import closed
from tests.harness.processes import wait_until
from tests.harness.proxy import run_proxy
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import api_versions_request, metadata_request
from tests.harness.stub_upstream import StubCluster, _build, _nested

SECRET = "secret-broker.internal"
TOO_MANY = MAX_NODES_PER_ANSWER + 1
"""Brokers in an oversized answer; their long hosts make it larger than what is rewritten on
the loop."""


class HostileStub(StubCluster):
    """The stub cluster, whose Metadata answers add `extra` brokers: to clients' requests, and
    to the proxy's own (client id "kvproxy") when `to_proxy` is set."""

    def __init__(self) -> None:
        super().__init__((1, 2, 3))
        self.extra: tuple[tuple[int, str], ...] = ()
        self.to_proxy = False
        self._from_proxy = threading.local()

    def _handle(self, node: Any, state: Any, payload: bytes) -> bytes | object | None:
        (length,) = struct.unpack_from(">h", payload, 8)
        self._from_proxy.value = payload[10 : 10 + max(length, 0)] == b"kvproxy"
        return super()._handle(node, state, payload)

    def _metadata(self, api_version: int, cid: int, request: Any) -> bytes:
        answer = super()._metadata(api_version, cid, request)
        if not self.extra or (self._from_proxy.value and not self.to_proxy):
            return answer
        response = decode_response(answer, METADATA, api_version)
        broker = _nested(type(response.body), "MetadataResponseBroker")
        added = tuple(
            _build(broker, node_id=node_id, host=host, port=9092, rack=None)
            for node_id, host in self.extra
        )
        body = response.body
        import dataclasses

        return self._encode(
            METADATA, api_version, cid, dataclasses.replace(body, brokers=body.brokers + added)
        )


@pytest.fixture
def hostile() -> Any:
    cluster = HostileStub()
    try:
        yield cluster
    finally:
        cluster.close()


def ask_with_the_rewrite_held(
    monkeypatch: pytest.MonkeyPatch, running: Any, topic: str
) -> RawKafkaClient:
    """A client's Metadata request for `topic`, its answer's rewrite held on a gate where the
    node count is checked (off the loop): another client's ApiVersions is answered meanwhile,
    then the gate opens. The asking client, its answer still to read."""
    import kvproxy.proxy.cluster.rewrite as rewrite_module

    real_check = rewrite_module.check_node_count
    reached, gate = threading.Event(), threading.Event()

    def gated(count: int, what: str = "brokers") -> None:
        if count > 1000:
            reached.set()
            assert gate.wait(60)
        real_check(count, what)

    monkeypatch.setattr(rewrite_module, "check_node_count", gated)
    asking = RawKafkaClient(running.host, running.port)
    with RawKafkaClient(running.host, running.port) as innocent:
        asking.send_frame(metadata_request(12, 31, [topic]))
        try:
            wait_until(reached.is_set, "the rewrite reached its gate", timeout=60)
            answer = innocent.request(api_versions_request(3, 5), timeout=30)
            assert int(decode_response(answer, API_VERSIONS, 3).body.error_code) == 0
        finally:
            gate.set()
    return asking


def test_a_broker_with_a_negative_node_id_never_reaches_the_client(hostile: HostileStub) -> None:
    """The entry is left out of the client's answer, as Kafka never lists such a broker; the
    other brokers are named at the proxy (before: relayed as the broker wrote it)."""
    hostile.extra = ((-1, SECRET),)
    with (
        run_proxy(hostile.bootstrap, max_brokers=10) as running,
        RawKafkaClient(running.host, running.port) as client,
    ):
        answer = client.request(metadata_request(12, 7, [hostile.topic]))
    assert SECRET.encode() not in answer
    brokers = decode_response(answer, METADATA, 12).body.brokers
    assert sorted(int(b.node_id) for b in brokers) == [1, 2, 3]


def test_an_oversized_answer_closes_the_connection_and_holds_no_one_else(
    hostile: HostileStub, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The count is checked beside the rewrite, off the loop: held there on a gate, another
    client's ApiVersions is answered meanwhile (before: the rewrite ran on the loop, which the
    gate held: nobody was answered). Then the asking connection is closed, with a log line."""
    caplog.set_level(logging.WARNING, "kvproxy")
    with run_proxy(hostile.bootstrap, max_brokers=10) as running:
        hostile.extra = tuple((100 + n, f"broker-{n:06d}.{SECRET}") for n in range(TOO_MANY - 3))
        with ask_with_the_rewrite_held(monkeypatch, running, hostile.topic) as asking:
            assert asking.is_closed_by_peer(timeout=30)
    said = [r.getMessage() for r in caplog.records]
    assert any(f"{TOO_MANY} nodes" in line and "more than" in line for line in said), said


def test_the_refresh_keeps_its_last_good_view_when_an_answer_is_oversized(
    hostile: HostileStub, caplog: pytest.LogCaptureFixture
) -> None:
    """The proxy's own Metadata refresh answered with too many brokers fails, says why once,
    and learns none of them: the brokers it knew are still named to clients."""
    caplog.set_level(logging.WARNING, "kvproxy")
    with run_proxy(hostile.bootstrap, max_brokers=10) as running:
        known = dict(running.server.listeners.brokers._addresses)
        hostile.extra = tuple((100 + n, f"b{n}") for n in range(TOO_MANY - 3))
        hostile.to_proxy = True
        refresh = running.server.listeners.metadata.refresh
        assert running.call(refresh()) is False
        assert running.call(refresh()) is False
        learnt = dict(running.server.listeners.brokers._addresses)
        hostile.to_proxy = False
        hostile.extra = ()
        with RawKafkaClient(running.host, running.port) as client:
            answer = client.request(metadata_request(12, 7, [hostile.topic]))
    assert learnt == known == hostile.nodes
    brokers = decode_response(answer, METADATA, 12).body.brokers
    assert sorted(int(b.node_id) for b in brokers) == [1, 2, 3]
    said = [r.getMessage() for r in caplog.records if f"{TOO_MANY} nodes" in r.getMessage()]
    assert len(said) == 1, said  # the same reason is said once, not at every retry
    assert "metadata from" in said[0] and "learnt before are kept" in said[0]


def test_a_small_answer_naming_many_brokers_is_rewritten_off_the_loop(
    hostile: HostileStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """5,000 brokers with short names (about 90 KB, within the bound): held on a gate where
    their count is checked, another client's ApiVersions is answered meanwhile (before: an
    answer under 256 KiB was rewritten on the loop, which the gate held), then the answer
    comes, naming no broker's own host."""
    with run_proxy(hostile.bootstrap, max_brokers=10) as running:
        hostile.extra = tuple((100 + n, f"s{n}") for n in range(5_000))
        with ask_with_the_rewrite_held(monkeypatch, running, hostile.topic) as asking:
            big = asking.recv_frame(timeout=60)
    brokers = decode_response(big, METADATA, 12).body.brokers
    assert {1, 2, 3} <= {int(b.node_id) for b in brokers}
    assert {str(b.host) for b in brokers} == {running.host}


def test_a_broker_host_no_resolver_takes_closes_its_clients_as_no_upstream(
    hostile: HostileStub, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker named at host ".." (which the IDNA codec refuses with a UnicodeError, not an
    OSError): a client of its listener is closed as `no_upstream`, the reason said in words
    (before: `internal_error`, "internal error: UnicodeError('encoding with 'idna' codec
    failed ...')")."""
    caplog.set_level(logging.WARNING, "kvproxy")
    hostile.extra, hostile.to_proxy = ((4, ".."),), True
    with run_proxy(hostile.bootstrap, max_brokers=10) as running:
        assert running.call(running.server.listeners.metadata.refresh())
        with RawKafkaClient(running.host, running.broker_port(4)) as client:
            assert client.is_closed_by_peer(timeout=30)
        wait_until(lambda: closed(running, "no_upstream") == 1, "the close counted", timeout=10)
        assert closed(running, "internal_error") == 0
    said = [r.getMessage() for r in caplog.records]
    assert any(
        line.startswith("upstream ..:9092 unreachable: not a host name a resolver can be asked")
        for line in said
    ), said
