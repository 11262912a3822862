"""Schema lookups one client causes must not hold another's: slots shared between connections,
a lookup dropped when its client leaves, a bound on any request's wait, and every id a request
needs looked up in one round.

The registry is `tests/harness/schema_registry.TestRegistry`; its gates (`registry.gate(id)`)
hold the requests about one id for as long as a test wants, so "answered while the other is
still waiting" is shown by order, not by time.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvproxy.protocol.messages import PRODUCE, decode_response
from tests.harness.metrics import scrape, value
from tests.harness.produce import batch, partitions_of, produce_frame, stored
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.raw_client import RawClientError, RawKafkaClient
from tests.harness.schema_registry import TestRegistry
from tests.harness.upstream import Upstream

REQUEST_TIMED_OUT = 7
INVALID_RECORD = 87
PRODUCE_VERSION = 9
ORDER_AVRO = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}],
}
ORDER_VALUE = b"\x02a\x0a"  # {"id": "a", "amount": 5}
DEADLINE_S = 20.0
"""How long a condition is polled before the test fails (a failure, never a pass, on time)."""


@pytest.fixture
def registry() -> Iterator[TestRegistry]:
    running = TestRegistry().start()
    try:
        yield running
    finally:
        for gate in list(running._gates.values()):
            gate.set()  # no handler thread left waiting
        running.stop()


def _rules(*topics: str) -> list[dict[str, Any]]:
    return [
        {
            "match": topic,
            "default_policies": "drop",
            "policies": ["batch_integrity", "crc", {"schema": {"value": "required"}}],
        }
        for topic in topics
    ]


def _section(registry: TestRegistry, **options: Any) -> dict[str, Any]:
    return {"url": registry.url, "timeout_ms": 60_000, "negative_cache_ttl_ms": 0, **options}


def _framed(schema_id: int, payload: bytes = ORDER_VALUE) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + payload


def _order_schema(number: int) -> str:
    return json.dumps({**ORDER_AVRO, "name": f"Order{number}"})


def _eventually(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


class _Pending:
    """A Produce request sent on its own connection, its answer read when it comes."""

    def __init__(self, proxy: RunningProxy, parts: list[tuple[str, int, bytes | None]]) -> None:
        self.client = RawKafkaClient(proxy.host, proxy.port)
        self.client.send_frame(produce_frame(PRODUCE_VERSION, 7, parts))
        self.answer: dict[tuple[str, int], Any] | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            frame = self.client.recv_frame(timeout=120)
        except (OSError, RawClientError):  # closed by the test: no answer
            return
        self.answer = partitions_of(decode_response(frame, PRODUCE, PRODUCE_VERSION).body)

    def wait(self) -> dict[tuple[str, int], Any]:
        assert _eventually(lambda: self.answer is not None), "no answer"
        assert self.answer is not None
        return self.answer

    def close(self) -> None:
        self.client.close()


def test_a_client_whose_ids_the_registry_holds_leaves_others_a_lookup_slot(
    upstream: Upstream, make_topic: Any, registry: TestRegistry
) -> None:
    hostile, innocent = make_topic(1), make_topic(1)
    innocent_id = registry.register(f"{innocent}-value", _order_schema(0))
    held_ids = list(range(5_000, 5_064))  # ids nobody registered, each held by the registry
    gates = [registry.gate(schema_id) for schema_id in held_ids]
    values = [_framed(schema_id) for schema_id in held_ids]
    with run_proxy(
        upstream.bootstrap,
        topics=_rules(hostile, innocent),
        schema_registry=_section(registry, max_lookups_per_request=64),
    ) as proxy:
        held = _Pending(proxy, [(hostile, 0, batch(*values))])
        try:
            assert _eventually(lambda: registry.count("/schemas/ids/5000") == 1)
            innocent_answer = _Pending(proxy, [(innocent, 0, batch(_framed(innocent_id)))])
            answered = _eventually(lambda: innocent_answer.answer is not None)
            still_held = held.answer is None and not any(gate.is_set() for gate in gates)
            for gate in gates:
                gate.set()
            hostile_answer = held.wait()
        finally:
            held.close()
        assert answered, "the innocent request waited for the hostile client's lookups"
        assert still_held
        assert innocent_answer.wait()[(innocent, 0)].error_code == 0
        innocent_answer.close()
    assert hostile_answer[(hostile, 0)].error_code == INVALID_RECORD  # unknown ids, once answered
    assert stored(upstream, innocent) == [_framed(innocent_id)]


def test_a_request_waits_for_lookups_at_most_request_wait_ms(
    upstream: Upstream, make_topic: Any, registry: TestRegistry
) -> None:
    topic = make_topic(2)
    slow_id = registry.register(f"{topic}-value", _order_schema(1))
    known_id = registry.register(f"{topic}-value", _order_schema(2))
    gate = registry.gate(slow_id)  # never opened: the registry does not answer in time
    with run_proxy(
        upstream.bootstrap,
        topics=_rules(topic),
        schema_registry=_section(registry, request_wait_ms=500),
    ) as proxy:
        pending = _Pending(
            proxy, [(topic, 0, batch(_framed(slow_id))), (topic, 1, batch(_framed(known_id)))]
        )
        answer = pending.wait()
        pending.close()
        assert _eventually(lambda: len(registry.aborted) >= 1)  # nobody waits: dropped
        samples = scrape(proxy)
    assert not gate.is_set()
    slow = answer[(topic, 0)]
    assert slow.error_code == REQUEST_TIMED_OUT  # retriable: the producer sends it again
    assert slow.error_message == (
        f"schema registry unavailable: schema id {slow_id}: "
        "no answer within schema_registry.request_wait_ms (500 ms)"
    )
    assert answer[(topic, 1)].error_code == 0
    assert stored(upstream, topic, 1) == [_framed(known_id)]
    assert stored(upstream, topic, 0) == []
    assert value(samples, "kvproxy_schema_lookups_total", outcome="abandoned") >= 1


def test_a_client_that_disconnects_drops_its_lookup(
    upstream: Upstream, make_topic: Any, registry: TestRegistry
) -> None:
    topic = make_topic(1)
    schema_id = registry.register(f"{topic}-value", _order_schema(3))
    gate = registry.gate(schema_id)
    with run_proxy(
        upstream.bootstrap, topics=_rules(topic), schema_registry=_section(registry)
    ) as proxy:
        leaving = _Pending(proxy, [(topic, 0, batch(_framed(schema_id)))])
        assert _eventually(lambda: registry.count(f"/schemas/ids/{schema_id}") == 1)
        leaving.close()
        dropped = _eventually(lambda: f"/schemas/ids/{schema_id}" in registry.aborted)
        assert dropped, "the registry was still asked for a client that had gone"
        catalog = proxy.server.schemas
        assert catalog is not None
        in_flight = proxy.call(_lookups_in_flight(catalog))
        samples = scrape(proxy)
    assert not gate.is_set()
    assert in_flight == 0
    assert value(samples, "kvproxy_schema_lookups_total", outcome="abandoned") == 1


async def _lookups_in_flight(catalog: Any) -> int:
    return int(catalog.lookups_in_flight)


def test_ids_of_every_partition_are_looked_up_in_one_round(
    upstream: Upstream, make_topic: Any, registry: TestRegistry
) -> None:
    topic = make_topic(3)
    ids = [registry.register(f"{topic}-value", _order_schema(10 + n)) for n in range(3)]
    gates = [registry.gate(schema_id) for schema_id in ids]
    parts = [(topic, n, batch(_framed(schema_id))) for n, schema_id in enumerate(ids)]
    with run_proxy(
        upstream.bootstrap, topics=_rules(topic), schema_registry=_section(registry)
    ) as proxy:
        pending = _Pending(proxy, parts)
        asked_together = _eventually(
            lambda: all(registry.count(f"/schemas/ids/{schema_id}") for schema_id in ids)
        )
        for gate in gates:
            gate.set()
        answer = pending.wait()
        pending.close()
    assert [answer[(topic, n)].error_code for n in range(3)] == [0, 0, 0]
    assert asked_together, "the ids were not all asked before the registry answered one"
    assert [registry.count(f"/schemas/ids/{schema_id}") for schema_id in ids] == [1, 1, 1]
    for n, schema_id in enumerate(ids):
        assert stored(upstream, topic, n) == [_framed(schema_id)]
