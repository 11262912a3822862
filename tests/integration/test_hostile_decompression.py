"""Decoding memory the proxy lacks for a while is answered with a code producers retry: a real
client (confluent-kafka) is refused while the process budget is full, retries, and its record is
stored once the budget frees. A frame that declares more memory than its request may hold is
refused before it is decoded."""

from __future__ import annotations

import time
from typing import Any

from tests.harness import Broker
from tests.harness.metrics import scrape, value
from tests.harness.produce import produce, stored
from tests.harness.proxy import proxy_config, run_proxy
from tests.harness.zstd_frames import zstd_window_batch

MiB = 1024 * 1024
MESSAGE_TOO_LARGE = 10
NOT_ENOUGH_REPLICAS = 19
REFUSALS = "kvproxy_decode_budget_refusals_total"


def test_a_full_process_budget_is_retried_by_the_client_until_it_frees(
    tansu: Broker, topic: str
) -> None:
    from confluent_kafka import Producer

    with run_proxy(tansu.bootstrap) as proxy:
        budget = proxy.server.decode_memory
        assert budget.try_take(budget.limit)  # other requests hold all of it
        producer = Producer(
            {
                "bootstrap.servers": f"{proxy.host}:{proxy.port}",
                "compression.type": "zstd",
                "linger.ms": 0,
                "retry.backoff.ms": 50,
                "message.timeout.ms": 30000,
            }
        )
        delivered: list[Any] = []
        producer.produce(
            topic, b"v" * 1000, partition=0, on_delivery=lambda e, m: delivered.append(e)
        )
        deadline = time.monotonic() + 20
        while (value(scrape(proxy), REFUSALS) or 0) < 2 and not delivered:
            assert time.monotonic() < deadline, "the proxy never refused the record"
            producer.poll(0.05)
        assert delivered == [], f"the first refusal ended the delivery: {delivered}"
        budget.give_back(budget.limit)
        assert producer.flush(25) == 0
        assert delivered == [None]
    assert stored(tansu, topic, 0) == [b"v" * 1000]


def test_a_frame_declaring_a_window_past_the_allowance_is_refused_before_decoding(
    tansu: Broker, topic: str
) -> None:
    """A 1-record zstd frame declaring a 128 MiB window: the decoder would allocate 128 MiB that
    no allowance counted. With 64 MiB per request it is refused, naming the limit; the process
    budget never held more than the limit."""
    config = proxy_config(tansu.bootstrap, limits={"decode_bytes_per_request": 64 * MiB})
    with run_proxy(config=config) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, zstd_window_batch(27))])
        refused = answers[(topic, 0)]
        assert refused.error_code == MESSAGE_TOO_LARGE, refused
        assert "limits.decode_bytes_per_request" in (refused.error_message or "")
        assert proxy.server.decode_memory.in_use == 0
    assert stored(tansu, topic) == []


def test_a_frame_declaring_a_window_within_the_allowance_is_accepted(
    tansu: Broker, topic: str
) -> None:
    with run_proxy(tansu.bootstrap) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, zstd_window_batch(20))])
        assert answers[(topic, 0)].error_code == 0
        assert 1 * MiB <= proxy.server.decode_memory.peak, "the declared window was counted"
    assert stored(tansu, topic) == [b"x"]
