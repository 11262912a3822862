"""A client inventing topic names, through a real proxy in front of Tansu: the metrics label only
the topics the cluster has, what the proxy keeps per name stays bounded, and the rejection log
stays small, one line per record, whatever the names and the client id hold.

Tansu accepts records for a name that is no topic (its Metadata still says UNKNOWN_TOPIC), which
is what made each invented name a label, a log line and entries in several caches."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvproxy.policies import config as policies_config
from kvproxy.proxy.lookups import topic_configs
from kvproxy.proxy.ops import logs, topic_labels
from kvproxy.proxy.refusals import sink as rejections
from tests.harness import Broker
from tests.harness.fuzz import produce_request
from tests.harness.metrics import get
from tests.harness.processes import HOST
from tests.harness.produce import batch
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.raw_client import RawKafkaClient
from tests.harness.reload import kvproxy_serve

NAMES = 2_000
PER_REQUEST = 200
BOUND = 500
"""The per-name bounds, lowered for the in-process proxy so that 2,000 names pass them."""
POLICIES = ["batch_integrity", "crc", "timestamps", "compacted_key", "json"]
FORGED = "1999-12-31 23:59:59,999 INFO kvproxy: forged"
"""A line a client would like to add to the log (in a topic name or client id)."""


def invented_names() -> list[str]:
    """2,000 names no topic has: long ones and ones with a newline first (they are logged)."""
    run = uuid.uuid4().hex[:8]
    long_names = [f"long-{run}-{n}-" + "x" * 32_000 for n in range(10)]
    newline_names = [f"nl-{run}-{n}\n{FORGED}" for n in range(40)]
    plain = [f"invented-{run}-{n}" for n in range(NAMES - 50)]
    return long_names + newline_names + plain


def produce_all(port: int, names: list[str], real: str, client_id: str) -> None:
    """Every name gets a batch that is not JSON (rejected), the real topic one that is."""
    with RawKafkaClient(HOST, port) as client:
        for start in range(0, len(names), PER_REQUEST):
            parts = [(name, 0, batch(b"not json")) for name in names[start : start + PER_REQUEST]]
            parts.append((real, 0, batch(b"[1]")))
            client.request(produce_request(9, start + 1, parts, client_id=client_id), timeout=60)


def topic_samples(text: str) -> dict[tuple[str, str, str], float]:
    """(sample name, topic label, outcome or code) -> value, for samples with a topic label."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "topic" in sample.labels:
                other = sample.labels.get("outcome") or sample.labels.get("code", "")
                out[(sample.name, sample.labels["topic"], other)] = sample.value
    return out


def structure_sizes(proxy: RunningProxy) -> dict[str, int]:
    async def read() -> dict[str, int]:
        srv = proxy.server
        return {
            "routing": srv.routing.cached_topics,
            "topic_configs": len(srv.topic_configs._entries),
            "absent_topics": len(srv.topic_configs._unknown),
            "rejection_windows": len(srv.sink.rejection_log._windows),
            "rejection_counts": len(srv.sink.rejections),
            **{f"labels_{k}": v for k, v in srv.metrics.topic_labels.sizes().items()},
        }

    return proxy.call(read())


def test_invented_topic_names_make_no_labels_and_keep_every_structure_bounded(
    tansu: Broker,
    make_topic: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for module, name in [
        (policies_config, "_CACHE_LIMIT"),
        (topic_configs, "MAX_TOPICS"),
        (topic_labels, "MAX_KNOWN"),
        (topic_labels, "MAX_PENDING"),  # names waiting for the paced Metadata lookups
        (logs, "MAX_KEYS"),
        (rejections, "MAX_REJECTION_KEYS"),
    ]:
        monkeypatch.setattr(module, name, BOUND)
    caplog.set_level(logging.INFO, logger="kvproxy.rejections")
    real = make_topic()
    names = invented_names()
    with run_proxy(
        tansu.bootstrap,
        defaults={"policies": POLICIES},
        topic_configs={"max_absent_topics": BOUND},
    ) as proxy:
        produce_all(proxy.port, names[: NAMES // 2], real, "app-1")
        halfway = structure_sizes(proxy)
        produce_all(proxy.port, names[NAMES // 2 :], real, "app-1")
        status, text = get(f"{proxy.metrics_url}/metrics")  # after the cluster's last answer
        assert status == 200
        sizes = structure_sizes(proxy)
        proxy.call(_flush_rejection_log(proxy))

    samples = topic_samples(text)
    assert {topic for _, topic, _ in samples} == {real, "_unknown"}
    batches = "kvproxy_produce_batches_total"
    assert samples[(batches, real, "accepted")] == NAMES // PER_REQUEST
    assert samples[(batches, "_unknown", "rejected")] == NAMES
    # the 50 names that cannot be topics are answered as Kafka answers them, matched by no rule
    assert samples[("kvproxy_policy_rejections_total", "_unknown", "87")] == NAMES - 50
    assert samples[("kvproxy_policy_rejections_total", "_unknown", "3")] == 50
    assert len(text) < 20_000, len(text)
    assert len(samples) < 20

    assert all(size <= BOUND for size in halfway.values()), halfway
    # names described or found absent depend on the lookup rates (topic_configs section): bounded
    assert sizes.pop("topic_configs") <= BOUND, sizes
    assert sizes.pop("absent_topics") <= BOUND, sizes
    assert sizes == {
        "routing": BOUND,
        "rejection_windows": BOUND,
        "rejection_counts": BOUND,
        "labels_labelled": 1,
        "labels_known": BOUND,
        "labels_pending": 0,
    }

    records = [r for r in caplog.records if r.name == "kvproxy.rejections"]
    lines = [r for r in records if getattr(r, "event", None) == "rejection"]
    assert len(lines) == logs.DEFAULT_TOTAL_RATE
    [summary] = [r for r in records if getattr(r, "event", None) == "rejection_lines_suppressed"]
    assert summary.suppressed == NAMES - logs.DEFAULT_TOTAL_RATE  # type: ignore[attr-defined]
    assert max(len(r.getMessage()) for r in records) < 3_000


async def _flush_rejection_log(proxy: RunningProxy) -> None:
    proxy.server.sink.rejection_log.flush(everything=True)


LINE_START = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) kvproxy")


def test_kvproxy_serve_logs_few_bounded_lines_and_no_forged_one(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    real = make_topic()
    names = invented_names()
    client_id = f"app\n{FORGED}\x1b[31m" + "c" * 30_000
    topics: list[dict[str, Any]] = [{"match": "*", "policies": POLICIES}]
    with kvproxy_serve(tmp_path, tansu, topics) as proxy:
        produce_all(proxy.port, names, real, client_id)
    text = proxy.stderr.read_text()  # complete: the proxy has stopped
    lines = text.splitlines()
    assert not [line for line in lines if line.startswith(FORGED)]
    assert all(LINE_START.match(line) for line in lines), [
        line[:200] for line in lines if not LINE_START.match(line)
    ]
    assert "\x1b" not in text
    rejections = [line for line in lines if " kvproxy.rejections: rejected " in line]
    assert len(rejections) == logs.DEFAULT_TOTAL_RATE
    # escaped where written: in each line's client id, and in the 40 names (topic and message)
    assert sum(line.count(f"\\n{FORGED}") for line in rejections) == 100 + 40 * 2
    [summary] = [line for line in lines if "more rejections not logged" in line]
    assert f" {NAMES - logs.DEFAULT_TOTAL_RATE} more rejections not logged in the last 60 s" in (
        summary
    )
    assert max(len(line) for line in lines) < 3_000
    assert len(text) < 250_000
