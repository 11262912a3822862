"""Custom RecordsPolicy classes through kvproxy: examples/policies.py's CurrencyPolicy and a policy
that crashes (fail closed, counted, the proxy keeps serving)."""

from __future__ import annotations

import asyncio
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from kvproxy.protocol.messages import PRODUCE, decode_response
from tests.harness import Broker
from tests.harness.clients import LINGER_MS, consume, produce_partitions
from tests.harness.produce import batch, produce, record_errors, stored
from tests.harness.proxy import run_proxy

POLICY_VIOLATION = 44
CURRENCY = {
    "custom": {"class": "examples.policies:CurrencyPolicy", "config": {"allowed": ["EUR", "USD"]}}
}
GBP = b'{"amount": 5, "currency": "GBP"}'
EUR = b'{"amount": 7, "currency": "EUR"}'
GBP_MESSAGE = "currency GBP is not allowed; allowed: EUR, USD"


def _payments(topic: str) -> list[dict[str, Any]]:
    return [
        {
            "match": topic,
            "default_policies": "drop",
            "policies": ["batch_integrity", "crc", CURRENCY],
        }
    ]


@pytest.mark.parametrize(
    ("version", "code"), [(9, POLICY_VIOLATION), (7, POLICY_VIOLATION), (2, 2)]
)
def test_currency_policy_raw_answers_per_version(
    tansu: Broker, make_topic: Any, version: int, code: int
) -> None:
    topic = make_topic(2)
    with run_proxy(tansu.bootstrap, topics=_payments(topic)) as proxy:
        answers = produce(
            proxy.host, proxy.port, version, [(topic, 0, batch(GBP)), (topic, 1, batch(EUR))]
        )
        assert proxy.server.sink.rejections == {(topic, "currency", POLICY_VIOLATION): 1}
    bad, ok = answers[(topic, 0)], answers[(topic, 1)]
    assert bad.error_code == code, bad
    if version >= 8:
        assert bad.error_message == GBP_MESSAGE
        assert record_errors(bad) == []
    else:
        assert not hasattr(bad, "error_message")
    assert ok.error_code == 0, ok
    assert stored(tansu, topic, 0) == []
    assert stored(tansu, topic, 1) == [EUR]


def test_currency_policy_confluent_kafka(tansu: Broker, make_topic: Any) -> None:
    from confluent_kafka import KafkaError

    from tests.harness.clients import confluent_send

    topic = make_topic(2)
    with run_proxy(tansu.bootstrap, topics=_payments(topic)) as proxy:
        bad, good = confluent_send(proxy.bootstrap, topic, {"value": GBP}, {"value": EUR})
        assert bad is not None and bad.code() == KafkaError.POLICY_VIOLATION, bad
        assert good is None, good
        # librdkafka does not hand the message to the application; it was on the wire (v8+)
        messages = [
            p.error_message
            for key, version, frame in proxy.responses
            if key == PRODUCE
            for t in decode_response(frame, PRODUCE, version).body.responses
            for p in t.partition_responses
            if p.error_code
        ]
        assert messages == [GBP_MESSAGE]
        got = consume(proxy.bootstrap, topic)
    assert got == {0: [], 1: [EUR]}


def test_currency_policy_kafka_python(tansu: Broker, make_topic: Any) -> None:
    from kafka import KafkaProducer
    from kafka.errors import PolicyViolationError

    topic = make_topic(2)
    with run_proxy(tansu.bootstrap, topics=_payments(topic)) as proxy:
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, linger_ms=LINGER_MS, retries=0)
        try:
            bad = producer.send(topic, value=GBP, partition=0)
            good = producer.send(topic, value=EUR, partition=1)
            producer.flush(15)
            with pytest.raises(PolicyViolationError):
                bad.get(timeout=15)
            good.get(timeout=15)
        finally:
            producer.close(5)
        assert [sorted(p) for p in produce_partitions(proxy)] == [
            [(topic, 0, POLICY_VIOLATION), (topic, 1, 0)]
        ]
        got = consume(proxy.bootstrap, topic)
    assert got == {0: [], 1: [EUR]}


async def test_currency_policy_aiokafka(tansu: Broker, make_topic: Any) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import PolicyViolationError

    topic = make_topic(2)
    with run_proxy(tansu.bootstrap, topics=_payments(topic)) as proxy:
        producer = AIOKafkaProducer(
            bootstrap_servers=proxy.bootstrap, enable_idempotence=False, linger_ms=LINGER_MS
        )
        await producer.start()
        try:
            futures = [
                await producer.send(topic, GBP, partition=0),
                await producer.send(topic, EUR, partition=1),
            ]
            bad, good = await asyncio.gather(*futures, return_exceptions=True)
        finally:
            await producer.stop()
        assert isinstance(bad, PolicyViolationError), repr(bad)
        assert not isinstance(good, BaseException), good
        assert [sorted(p) for p in produce_partitions(proxy)] == [
            [(topic, 0, POLICY_VIOLATION), (topic, 1, 0)]
        ]
        got = consume(proxy.bootstrap, topic)
    assert got == {0: [], 1: [EUR]}


CRASHY = '''
from kvproxy.policies import ACCEPT


class Crashy:
    """Raises ValueError on a record whose value is b"boom"."""

    name = "crashy"

    @classmethod
    def create(cls, context, options):
        return cls()

    def validate(self, topic, partition, batch):
        for record in batch.records():
            if record.value == b"boom":
                raise ValueError("cannot handle boom")
        return ACCEPT

    def close(self):
        pass
'''


def test_crashing_custom_policy_fails_closed_and_the_proxy_keeps_serving(
    tansu: Broker, make_topic: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The module lives beside the (notional) config file: the proxy's base_dir, here its CWD."""
    module = f"crashy_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(CRASHY))
    monkeypatch.chdir(tmp_path)
    topic = make_topic(2)
    topics = [
        {
            "match": topic,
            "default_policies": "drop",
            "policies": [{"custom": {"class": f"{module}:Crashy"}}],
        }
    ]
    with run_proxy(tansu.bootstrap, topics=topics) as proxy:
        answers = produce(
            proxy.host,
            proxy.port,
            9,
            [(topic, 0, batch(b"fine", b"boom")), (topic, 1, batch(b"ok"))],
        )
        bad = answers[(topic, 0)]
        assert bad.error_code == 87, bad
        assert "cannot handle boom" in (bad.error_message or ""), bad
        assert answers[(topic, 1)].error_code == 0
        # the proxy lives on: a new connection, a good request
        again = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(b"after"))])
        assert again[(topic, 0)].error_code == 0
        assert proxy.server.routing.crash_counts() == {"crashy": 1}
        assert proxy.server.sink.rejections == {(topic, "crashy", 87): 1}
    assert stored(tansu, topic, 0) == [b"after"]
    assert stored(tansu, topic, 1) == [b"ok"]
