"""Quarantine entries made up by tests, as the proxy would write them (a fresh id, a time); the
journal settings for `run_proxy` and the dead-letter counts on /metrics."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from kvproxy.journal import QuarantineEntry
from tests.harness.metrics import scrape, value
from tests.harness.processes import kvproxy
from tests.harness.proxy import RunningProxy
from tests.harness.upstream import Upstream


def new_entry(
    kind: str,
    topic: str,
    partition: int,
    *,
    clock: Callable[[], float] = time.time,
    **fields: Any,
) -> QuarantineEntry:
    """A new entry with a fresh id (uuid4 as 32 hex digits) and the current time."""
    return QuarantineEntry(
        id=uuid.uuid4().hex,
        time_ms=int(clock() * 1000),
        kind=kind,
        topic=topic,
        partition=partition,
        **fields,
    )


def replay_mark(
    replayed: QuarantineEntry, *, clock: Callable[[], float] = time.time
) -> QuarantineEntry:
    """The "replayed" mark of `replayed` (same topic and partition, no records)."""
    return new_entry(
        "replayed", replayed.topic, replayed.partition, clock=clock, replayed_id=replayed.id
    )


def journal_settings(directory: Path | str, **overrides: Any) -> dict[str, Any]:
    return {"dir": str(directory), "flush_interval_ms": 50, **overrides}


def dead_letter_counts(proxy: RunningProxy) -> tuple[float, float]:
    samples = scrape(proxy)
    return (
        value(samples, "kvproxy_dead_letters_total", result="written"),
        value(samples, "kvproxy_dead_letters_total", result="failed"),
    )


def consume(bootstrap: str, topic: str, partition: int, count: int) -> list[Any]:
    """Messages of topic-partition read with confluent-kafka straight from the broker: until
    `count` arrived, then one more second to catch any extra copy."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "kvproxy-quarantine-tests",
            "enable.auto.commit": False,
        }
    )
    got: list[Any] = []
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        deadline = time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append(message)
        extra_until = time.monotonic() + 1.0
        while time.monotonic() < extra_until:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append(message)
    finally:
        consumer.close()
    return got


def relaxed_config(tmp_path: Path, upstream: Upstream, journal_dir: Path) -> Path:
    """The config after the cause is fixed: the topic no longer requires JSON."""
    config = tmp_path / "relaxed.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "upstream": {"bootstrap_servers": [upstream.bootstrap]},
                "quarantine": {"dir": str(journal_dir)},
                "topics": [],
            }
        )
    )
    return config


def replay(config: Path, topic: str, *extra: str) -> str:
    """`kvproxy quarantine replay` of `topic` under `config`; its standard output."""
    return kvproxy("quarantine", "replay", "-c", str(config), "--topic", topic, *extra).stdout
