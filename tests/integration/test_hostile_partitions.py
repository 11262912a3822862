"""Produce requests naming many partitions (empty ones too): refused as a whole past
`limits.max_partitions_per_request` without being decoded, read and decided off the event loop,
one rejection logged and nothing kept for them."""

from __future__ import annotations

import struct
import threading
from pathlib import Path
from typing import Any

import pytest

from kvproxy.journal import JournalReader
from kvproxy.protocol.messages import PRODUCE, decode_response
from tests.harness import Broker
from tests.harness.metrics import closed, scrape, value
from tests.harness.partitions import many_partitions_request
from tests.harness.processes import wait_until
from tests.harness.produce import batch, produce, stored
from tests.harness.proxy import run_proxy
from tests.harness.proxy_checks import assert_serves
from tests.harness.quarantine import journal_settings
from tests.harness.raw_client import RawKafkaClient

MESSAGE_TOO_LARGE = 10
HOSTILE = 200_000
"""Partitions of the hostile request: above the default limit (10,000), each with null records."""


def _codes(answer: bytes, version: int) -> list[int]:
    body = decode_response(answer, PRODUCE, version).body
    return [int(p.error_code) for t in body.responses for p in t.partition_responses]


def _upstream_bytes(proxy: Any) -> float:
    return value(scrape(proxy), "kvproxy_bytes_total", direction="upstream_out")


@pytest.mark.parametrize("version", [2, 8, 9])
def test_a_request_past_the_partition_limit_is_refused_whole_and_never_forwarded(
    tansu: Broker, topic: str, tmp_path: Path, version: int
) -> None:
    journal_dir = tmp_path / "journal"
    payload = many_partitions_request(version, {topic: HOSTILE}, correlation_id=41)
    with run_proxy(tansu.bootstrap, quarantine=journal_settings(journal_dir)) as proxy:
        sent_before = _upstream_bytes(proxy)
        with RawKafkaClient(proxy.host, proxy.port) as client:
            answer = client.request(payload, timeout=60)
        assert struct.unpack_from(">i", answer)[0] == 41
        assert _codes(answer, version) == [MESSAGE_TOO_LARGE] * HOSTILE
        body = decode_response(answer, PRODUCE, version).body
        partitions = body.responses[0].partition_responses
        assert [int(p.index) for p in partitions] == list(range(HOSTILE))
        if version >= 8:
            first = partitions[0].error_message or ""
            assert "limits.max_partitions_per_request" in first and "10000" in first
            assert all(p.error_message is None for p in partitions[1:])
        assert len(answer) <= 36 * HOSTILE + 1000  # fixed fields only after the first partition
        assert _upstream_bytes(proxy) - sent_before < len(payload)  # never forwarded
        scraped = scrape(proxy)
        refused = value(
            scraped,
            "kvproxy_policy_rejections_total",
            topic=topic,
            policy="max_partitions_per_request",
            code=str(MESSAGE_TOO_LARGE),
        )
        assert refused == 1  # one rejection for the request, not one per partition
        assert proxy.server.journal is not None
        assert proxy.server.journal.flush(10)
        assert_serves(proxy)
    assert list(JournalReader(journal_dir).entries()) == []  # nothing read, nothing kept


def test_a_request_past_the_limit_with_acks_0_closes_the_connection(
    tansu: Broker, topic: str
) -> None:
    """acks=0: nothing to answer, so the connection is closed, as for any refused acks=0
    request; every partition holds a valid batch (before: all forwarded, stored)."""
    payload = many_partitions_request(8, {topic: 20_000}, acks=0, records=batch(b"v"))
    with run_proxy(tansu.bootstrap) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            client.send_frame(payload)
            assert client.is_closed_by_peer(timeout=60)
        wait_until(lambda: closed(proxy, "acks0_rejection") == 1, "the close counted")
        assert_serves(proxy)
    assert stored(tansu, topic, 0) == []


def test_a_refusal_larger_than_a_frame_closes_the_connection(tansu: Broker, topic: str) -> None:
    """An answer naming every partition would pass `max_frame_bytes` (here 1 MiB: 100,000
    partitions take 3.6 MB to answer): the connection is closed, as for a frame over it."""
    limits = {"max_frame_bytes": 1024 * 1024}
    with run_proxy(tansu.bootstrap, limits=limits) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            client.send_frame(many_partitions_request(8, {topic: 100_000}))
            assert client.is_closed_by_peer(timeout=60)
        wait_until(lambda: closed(proxy, "malformed") == 1, "the close counted")
        assert_serves(proxy)


def test_the_limit_is_a_setting(tansu: Broker, topic: str) -> None:
    """Within `max_partitions_per_request` the request is decided as usual (here: 300 empty
    partitions, which Tansu answers for itself); one partition more is refused."""
    limits = {"max_partitions_per_request": 300}
    with (
        run_proxy(tansu.bootstrap, limits=limits) as proxy,
        RawKafkaClient(proxy.host, proxy.port) as client,
    ):
        within = client.request(many_partitions_request(8, {topic: 300}), timeout=30)
        beyond = client.request(many_partitions_request(8, {topic: 301}), timeout=30)
    assert MESSAGE_TOO_LARGE not in _codes(within, 8) and len(_codes(within, 8)) == 300
    assert _codes(beyond, 8) == [MESSAGE_TOO_LARGE] * 301


def test_an_innocent_client_is_answered_while_the_hostile_request_is_being_refused(
    tansu: Broker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal is held on a gate: the other client's Produce is answered meanwhile, so the
    loop is not held by the hostile request (before: decoded, checked and answered on the loop,
    the gate never reached)."""
    reached, gate = threading.Event(), threading.Event()
    from kvproxy.protocol.produce_shape import refusal_answer as real_refusal

    def gated(*args: Any, **kwargs: Any) -> bytes:
        reached.set()
        assert gate.wait(60)
        return real_refusal(*args, **kwargs)

    monkeypatch.setattr("kvproxy.proxy.produce.many_partitions.refusal_answer", gated)
    payload = many_partitions_request(8, {topic: HOSTILE}, correlation_id=9)
    with run_proxy(tansu.bootstrap) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as hostile:
            hostile.send_frame(payload)
            try:
                wait_until(reached.is_set, "the refusal reached its gate", timeout=60)
                answers = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(b"innocent"))])
                assert answers[(topic, 0)].error_code == 0
            finally:
                gate.set()
            answer = hostile.recv_frame(timeout=60)
        assert _codes(answer, 8) == [MESSAGE_TOO_LARGE] * HOSTILE
    assert stored(tansu, topic, 0) == [b"innocent"]


def test_many_empty_partitions_are_decided_off_the_loop(tansu: Broker, topic: str) -> None:
    """The work of a request counts every partition: 2,000 empty ones (no record, a few bytes)
    are decided on the decoding thread (before: weighed as nothing, decided on the loop)."""
    with run_proxy(tansu.bootstrap) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            answer = client.request(many_partitions_request(8, {topic: 2_000}), timeout=30)
        assert len(_codes(answer, 8)) == 2_000
        assert value(scrape(proxy), "kvproxy_produce_off_loop_total") == 1
