"""What an operator scrapes: exact counts on /metrics, and /healthz and /readyz."""

from __future__ import annotations

import os
import time
from typing import Any

from tests.harness import Broker, run_tansu
from tests.harness.metrics import get, scrape, value
from tests.harness.produce import JSON_ONLY, batch, produce, produce_frame
from tests.harness.proxy import run_proxy
from tests.harness.raw_client import RawKafkaClient


def test_one_good_and_one_bad_partition_are_counted_exactly(tansu: Broker, make_topic: Any):
    topic = make_topic(2)
    with run_proxy(tansu.bootstrap, topics=[{"match": topic, **JSON_ONLY}]) as proxy:
        answers = produce(
            proxy.host, proxy.port, 9, [(topic, 0, batch(b"not json")), (topic, 1, batch(b"[1]"))]
        )
        assert (answers[(topic, 0)].error_code, answers[(topic, 1)].error_code) == (87, 0)
        samples = scrape(proxy)
    rejections = "kvproxy_policy_rejections_total"
    assert value(samples, rejections, topic=topic, policy="json", code="87") == 1
    assert sum(v for (name, _), v in samples.items() if name == rejections) == 1
    for name in ("kvproxy_produce_batches_total", "kvproxy_produce_records_total"):
        assert value(samples, name, topic=topic, outcome="rejected") == 1
        assert value(samples, name, topic=topic, outcome="accepted") == 1
    assert (
        value(samples, "kvproxy_requests_total", api="produce", outcome="partially_rejected") == 1
    )
    assert value(samples, "kvproxy_produce_proxy_latency_seconds_count") == 1
    assert value(samples, "kvproxy_produce_upstream_latency_seconds_count") == 1
    assert value(samples, "kvproxy_bytes_total", direction="client_in") > 0
    assert value(samples, "kvproxy_bytes_total", direction="upstream_out") > 0


def test_topic_labels_are_bounded(tansu: Broker, make_topic: Any) -> None:
    topics = [make_topic(1) for _ in range(3)]
    with run_proxy(tansu.bootstrap, defaults=JSON_ONLY, metrics={"topic_label_limit": 2}) as proxy:
        for topic in topics:
            produce(proxy.host, proxy.port, 9, [(topic, 0, batch(b"bad"))])
        samples = scrape(proxy)
    name = "kvproxy_policy_rejections_total"
    assert value(samples, name, topic=topics[0], policy="json", code="87") == 1
    assert value(samples, name, topic=topics[1], policy="json", code="87") == 1
    assert value(samples, name, topic="_other", policy="json", code="87") == 1
    assert value(samples, name, topic=topics[2], policy="json", code="87") == 0


def test_closed_connections_and_crashes_are_counted(
    tansu: Broker, make_topic: Any, tmp_path: Any
) -> None:
    (tmp_path / "crashing_policy.py").write_text(
        "class Crash:\n"
        "    name = 'crash'\n"
        "    @classmethod\n"
        "    def create(cls, context, options): return cls()\n"
        "    def validate(self, topic, partition, batch): raise ValueError('boom')\n"
        "    def close(self): pass\n"
    )
    good, crashy = make_topic(1), make_topic(1)
    topics = [
        {
            "match": crashy,
            "default_policies": "drop",
            "policies": [{"custom": {"class": "crashing_policy:Crash"}}],
        },
        {"match": good, **JSON_ONLY},
    ]
    cwd = os.getcwd()
    os.chdir(tmp_path)  # custom modules resolve against the config's folder (here: the CWD)
    try:
        with run_proxy(tansu.bootstrap, topics=topics) as proxy:
            assert (
                produce(proxy.host, proxy.port, 9, [(crashy, 0, batch(b"x"))])[
                    (crashy, 0)
                ].error_code
                == 87
            )
            with RawKafkaClient(proxy.host, proxy.port) as client:
                client.send_frame(produce_frame(9, 3, [(good, 0, batch(b"bad"))], acks=0))
                assert client.is_closed_by_peer(timeout=3)
            with RawKafkaClient(proxy.host, proxy.port) as client:
                client.send_frame(b"\xff\xff\xff\xff")  # negative size
                assert client.is_closed_by_peer(timeout=3)
            proxy.wait_until_idle()
            samples = scrape(proxy)
    finally:
        os.chdir(cwd)
    assert value(samples, "kvproxy_policy_crashes_total", policy="crash") == 1
    assert value(samples, "kvproxy_connections_closed_total", reason="acks0_rejection") == 1
    assert value(samples, "kvproxy_connections_closed_total", reason="malformed") == 1
    assert value(samples, "kvproxy_client_connections") == 0
    assert value(samples, "kvproxy_upstream_connections") == 0


def test_healthz_and_readyz_follow_the_upstream() -> None:
    with run_tansu() as server, run_proxy(server.broker.bootstrap) as proxy:
        assert get(f"{proxy.metrics_url}/healthz") == (200, "ok\n")
        status, text = get(f"{proxy.metrics_url}/readyz")
        assert status == 200, text
        assert value(scrape(proxy), "kvproxy_ready") == 1
        server.stop()
        deadline = time.monotonic() + 10
        while (status := get(f"{proxy.metrics_url}/readyz")[0]) != 503:
            assert time.monotonic() < deadline, "never turned unready"
            time.sleep(0.2)
        assert get(f"{proxy.metrics_url}/healthz")[0] == 200  # alive, just not ready
        assert value(scrape(proxy), "kvproxy_ready") == 0
        server.restart()
        deadline = time.monotonic() + 10
        while get(f"{proxy.metrics_url}/readyz")[0] != 200:
            assert time.monotonic() < deadline, "never turned ready again"
            time.sleep(0.2)
        assert get(f"{proxy.metrics_url}/nope")[0] == 404


def test_upstream_connect_failures_are_counted(tansu: Broker) -> None:
    with run_proxy(["127.0.0.1:1", tansu.bootstrap]) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            client.send_frame(produce_frame(9, 1, [], acks=1))
            client.recv_frame(timeout=5)
        samples = scrape(proxy)
    assert value(samples, "kvproxy_upstream_connect_failures_total", upstream="127.0.0.1:1") >= 1
