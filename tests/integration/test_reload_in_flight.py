"""A reload while a Produce request waits for the broker: the request is answered under the file
it was judged by, never with a mix of two files.

The proxy is in front of Tansu through a relay that holds the broker's Produce answers
(`tests.harness.capture`, Tansu advertising the relay's address), so the reload happens after the
proxy has refused one partition and forwarded the other, and before the broker's answer for the
other comes back to be merged with the refusal.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvproxy.protocol import error_codes
from kvproxy.protocol.messages import PRODUCE
from kvproxy.proxy.serve.reload import ConfigReloader
from tests.harness import create_topic, unique_topic_name
from tests.harness.capture import RecordingRelay, read_produce_request, recording_tansu
from tests.harness.produce import JSON_ONLY, stored
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.reload import reload_once

PROFILE_CODE = {"kafka": error_codes.INVALID_RECORD, "kip": error_codes.KIP_INVALID_RECORD}


@pytest.fixture(scope="module")
def relayed() -> Iterator[tuple[RecordingRelay, Any]]:
    with recording_tansu() as (relay, server):
        yield relay, server.broker


def wait_for(condition: Any, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def rules(proxy: RunningProxy, topic: str, profile: str) -> str:
    base = proxy.config.model_dump(mode="json", include={"listen", "upstream"})
    return yaml.safe_dump(
        {
            **base,
            "errors": {"profile": profile},
            "topics": [{"match": topic, "compacted": False, **JSON_ONLY}],
        }
    )


@pytest.mark.parametrize(("judged_under", "reloaded_to"), [("kafka", "kip"), ("kip", "kafka")])
def test_a_reload_before_the_broker_answers_does_not_change_the_refusal(
    relayed: tuple[RecordingRelay, Any], tmp_path: Path, judged_under: str, reloaded_to: str
) -> None:
    """One kafka-python Produce request with a value that is not JSON on partition 0 and a JSON
    value on partition 1: the proxy refuses partition 0 under `judged_under` and forwards
    partition 1; the file then changes to the other error profile; when the broker's answer
    arrives, partition 0 is still answered with `judged_under`'s code."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    relay, broker = relayed
    topic = create_topic(broker.bootstrap, unique_topic_name("reload-flight"), 2)
    config_file = tmp_path / "kvproxy.yaml"
    with run_proxy(broker.bootstrap) as proxy:
        config_file.write_text(rules(proxy, topic, judged_under))

        async def reload() -> bool:
            reloader = ConfigReloader(proxy.server, config_file, poll_interval=0, retire_grace=0)
            return await reload_once(reloader)

        assert proxy.call(reload())
        producer = KafkaProducer(
            bootstrap_servers=proxy.bootstrap,
            linger_ms=500,  # both partitions in one request (kafka-python sends one per broker)
            retries=0,
            acks="all",
        )
        try:
            producer.partitions_for(topic)  # metadata before the answers are held
            relay.clear()
            relay.hold_answers(PRODUCE)
            try:
                refused = producer.send(topic, b"not json", key=b"k", partition=0)
                accepted = producer.send(topic, b'{"ok": 1}', key=b"k", partition=1)
                # the proxy has judged the request once it forwards what it accepted
                wait_for(lambda: relay.requests(PRODUCE), "the accepted partition to be forwarded")
                assert not refused.is_done and not accepted.is_done
                config_file.write_text(rules(proxy, topic, reloaded_to))
                assert proxy.call(reload())
                assert proxy.server.config.errors.profile == reloaded_to
            finally:
                relay.release_answers()
            assert accepted.get(timeout=20).partition == 1
            with pytest.raises(KafkaError) as error:
                refused.get(timeout=20)
        finally:
            producer.close(5)
        assert error.value.errno == PROFILE_CODE[judged_under], error.value
        forwarded = [read_produce_request(f.payload) for f in relay.requests(PRODUCE)]
        assert [[(t, p) for t, p, _ in r.partitions] for r in forwarded] == [[(topic, 1)]]
    assert stored(broker, topic, 0) == []
    assert stored(broker, topic, 1) == [b'{"ok": 1}']
