"""A policy of another distribution (examples/policy-plugin), installed into the venv and named
in the YAML like a built-in: through the proxy, against the real broker, with real clients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import Broker
from tests.harness.clients import consume
from tests.harness.policy_plugin import POLICY, install_example_plugin
from tests.harness.produce import batch, produce, record_errors, stored
from tests.harness.proxy import run_proxy

POLICY_VIOLATION = 44
SPAM = b"buy spam now"
FINE = b"a fine value"


@pytest.fixture(scope="module", autouse=True)
def _installed() -> Iterator[None]:
    install_example_plugin()
    yield


def _chat(topic: str) -> list[dict[str, Any]]:
    return [
        {
            "match": topic,
            "default_policies": "drop",
            "policies": ["batch_integrity", "crc", {POLICY: {"word": "spam"}}],
        }
    ]


def _policy(proxy: Any, topic: str) -> Any:
    chain = proxy.server.routing.chain_for(topic)
    (policy,) = (p for p in chain.policies if p.name == POLICY)
    return policy


def test_the_plugin_refuses_by_name_and_observes_what_the_broker_took(
    tansu: Broker, make_topic: Any
) -> None:
    topic = make_topic(2)
    with run_proxy(tansu.bootstrap, topics=_chat(topic)) as proxy:
        answers = produce(
            proxy.host, proxy.port, 9, [(topic, 0, batch(FINE, SPAM)), (topic, 1, batch(FINE))]
        )
        assert proxy.server.sink.rejections == {(topic, POLICY, POLICY_VIOLATION): 1}
        assert _policy(proxy, topic).accepted == 1  # its observe saw partition 1 accepted
    bad, ok = answers[(topic, 0)], answers[(topic, 1)]
    assert bad.error_code == POLICY_VIOLATION, bad
    assert bad.error_message == f"1 record(s) in {topic}-0 contain 'spam'"
    assert record_errors(bad) == [(1, "value contains 'spam'")]
    assert ok.error_code == 0, ok
    assert stored(tansu, topic, 0) == []
    assert stored(tansu, topic, 1) == [FINE]


def test_the_plugin_through_confluent_kafka(tansu: Broker, make_topic: Any) -> None:
    from confluent_kafka import KafkaError

    from tests.harness.clients import confluent_send

    topic = make_topic(2)
    with run_proxy(tansu.bootstrap, topics=_chat(topic)) as proxy:
        bad, good = confluent_send(proxy.bootstrap, topic, {"value": SPAM}, {"value": FINE})
        assert bad is not None and bad.code() == KafkaError.POLICY_VIOLATION, bad
        assert good is None, good
        got = consume(proxy.bootstrap, topic)
        assert _policy(proxy, topic).accepted == 1
    assert got == {0: [], 1: [FINE]}
