"""A Metadata request naming many topics: its large answer is rewritten off the event loop, so
other connections are answered meanwhile, and this connection's answers keep their order."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kvproxy.protocol.messages import METADATA, decode_response
from tests.harness import Broker
from tests.harness.processes import wait_until
from tests.harness.produce import batch, produce, stored
from tests.harness.proxy import run_proxy
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import correlation_id_of, metadata_request

TOPICS = 20_000
"""Names in the hostile request: an answer of about 800 KB (each name answered
UNKNOWN_TOPIC_OR_PARTITION), above what is rewritten on the loop."""


def test_an_innocent_client_is_answered_while_a_large_metadata_answer_is_rewritten(
    tansu: Broker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The large answer's decoding is held on a gate: another client's Produce is answered
    meanwhile (before: rewritten on the loop, which the gate then held: nobody answered)."""
    from kvproxy.protocol.messages import decode_response as real_decode

    reached, gate = threading.Event(), threading.Event()

    def gated(frame: Any, api_key: int, api_version: int) -> Any:
        if api_key == METADATA and len(frame) > 100_000:
            reached.set()
            assert gate.wait(60)
        return real_decode(frame, api_key, api_version)

    monkeypatch.setattr("kvproxy.proxy.cluster.rewrite.decode_response", gated)
    names = [f"hostile-{i:06d}" for i in range(TOPICS)]
    with (
        run_proxy(tansu.bootstrap) as running,
        RawKafkaClient(running.host, running.port) as hostile,
    ):
        hostile.send_frame(metadata_request(12, 31, names))
        hostile.send_frame(metadata_request(12, 32, [topic]))  # answered after the big one
        try:
            wait_until(reached.is_set, "the rewrite reached its gate", timeout=60)
            answers = produce(running.host, running.port, 9, [(topic, 0, batch(b"innocent"))])
            assert answers[(topic, 0)].error_code == 0
        finally:
            gate.set()
        big = hostile.recv_frame(timeout=60)
        small = hostile.recv_frame(timeout=60)
        node_ports = {int(b.port) for b in decode_response(small, METADATA, 12).body.brokers}
    assert (correlation_id_of(big), correlation_id_of(small)) == (31, 32)
    body = decode_response(big, METADATA, 12).body
    assert [str(t.name) for t in body.topics] == names
    assert {int(b.port) for b in body.brokers} == node_ports  # the addresses rewritten
    assert int(tansu.bootstrap.rsplit(":", 1)[1]) not in node_ports
    small_body = decode_response(small, METADATA, 12).body
    assert [str(t.name) for t in small_body.topics] == [topic]
    assert stored(tansu, topic, 0) == [b"innocent"]
