"""Topic settings learned from Apache Kafka (4.x and 3.9) with DescribeConfigs: what
`kvproxy topics` shows for topics made with settings, what a running proxy enforces from them,
and changes made with IncrementalAlterConfigs while it runs.

A running proxy keeps a topic's settings for `topic_configs.ttl_ms` (60 s by default) and asks
again on the first Produce for the topic after that; the tests set it to half a second. The
broker enforces the same settings, so an answer alone does not say who refused: the proxy's log
line ("rejected T-0: policy P") does, as an operator sees it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from kvproxy.cli import main as kvproxy
from kvproxy.protocol.records import build_batch
from tests.harness.kafka_broker import KAFKA_3, KAFKA_4, KafkaCluster
from tests.harness.produce import produce
from tests.harness.proxy import RunningProxy, run_proxy

LONG_MAX = 2**63 - 1
HOUR_MS = 3_600_000
INVALID_RECORD = 87
INVALID_TIMESTAMP = 32
MESSAGE_TOO_LARGE = 10
AFTER_MAX_DEFAULT = {KAFKA_4: str(HOUR_MS), KAFKA_3: str(LONG_MAX)}
"""message.timestamp.after.max.ms when nothing sets it: one hour from 4.0 (KIP-1030)."""


def topics_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cluster: KafkaCluster, *topics: str
) -> dict[str, dict[str, tuple[str, str, str | None]]]:
    """`kvproxy topics --json` for `topics`: per topic, setting -> (value, source, via)."""
    path = tmp_path / "kvproxy.yaml"
    path.write_text(json.dumps({"upstream": {"bootstrap_servers": cluster.bootstrap_servers}}))
    assert kvproxy(["topics", "-c", str(path), "--json", *topics]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["cluster"] == "answered"
    return {
        entry["topic"]: {s["name"]: (s["value"], s["source"], s["via"]) for s in entry["settings"]}
        for entry in document["topics"]
    }


def alter(cluster: KafkaCluster, topic: str, **settings: str | None) -> None:
    """IncrementalAlterConfigs on `topic`: SET each setting (`_` for `.`), DELETE it if None."""
    entries = [
        ConfigEntry(
            name.replace("_", "."),
            value,
            incremental_operation=AlterConfigOpType.DELETE
            if value is None
            else AlterConfigOpType.SET,
        )
        for name, value in settings.items()
    ]
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    admin = cluster.admin()  # kept until the answer: a dropped client cancels its requests
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def records(*, key: bytes | None = b"k", size: int = 10, age_ms: int = 0) -> bytes:
    return build_batch([(key, b"v" * size, None, int(time.time() * 1000) - age_ms)])


def answer(proxy: RunningProxy, topic: str, raw: bytes) -> int:
    """The error code of one Produce v9 through the proxy."""
    return int(produce(proxy.host, proxy.port, 9, [(topic, 0, raw)])[topic, 0].error_code)


def refused_by_proxy(
    caplog: pytest.LogCaptureFixture, topic: str, policy: str | None = None
) -> bool:
    """Whether the proxy's log says it refused a batch for `topic` (by `policy`, or any)."""
    line = f"rejected {topic}-0: " if policy is None else f"rejected {topic}-0: policy {policy},"
    return any(line in record.getMessage() for record in caplog.records)


def until_refused_by_proxy(
    caplog: pytest.LogCaptureFixture,
    proxy: RunningProxy,
    topic: str,
    raw: bytes,
    *,
    policy: str,
    timeout: float = 30.0,
) -> int:
    """Send `raw` until the proxy itself refuses it (its cached settings expire, it asks the
    broker again); the code the client got."""
    caplog.clear()
    deadline = time.monotonic() + timeout
    while True:
        code = answer(proxy, topic, raw)
        if refused_by_proxy(caplog, topic, policy):
            return code
        assert time.monotonic() < deadline, f"the proxy never refused it itself ({policy})"
        time.sleep(0.1)


def until_forwarded(
    caplog: pytest.LogCaptureFixture, proxy: RunningProxy, topic: str, raw: bytes
) -> int:
    """Send `raw` until the proxy no longer refuses it; the code the broker answered."""
    deadline = time.monotonic() + 30
    while True:
        caplog.clear()
        code = answer(proxy, topic, raw)
        if not refused_by_proxy(caplog, topic):
            return code
        assert time.monotonic() < deadline, "the proxy kept refusing it"
        time.sleep(0.1)


@pytest.fixture
def proxy_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="kvproxy")
    return caplog


def test_kvproxy_topics_shows_what_the_broker_says(
    any_kafka: KafkaCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Settings made on the topic are "cluster", the rest "cluster default" with the values of
    this Kafka version."""
    configured = any_kafka.create_topic(
        config={
            "cleanup.policy": "compact",
            "message.timestamp.type": "LogAppendTime",
            "message.timestamp.before.max.ms": "60000",
            "message.timestamp.after.max.ms": "120000",
            "max.message.bytes": "5000",
            "segment.bytes": "2097152",
        }
    )
    plain = any_kafka.create_topic()
    shown = topics_json(capsys, tmp_path, any_kafka, configured, plain)
    assert shown[configured] == {
        "cleanup.policy": ("compact", "cluster", None),
        "message.timestamp.type": ("LogAppendTime", "cluster", None),
        "message.timestamp.before.max.ms": ("60000", "cluster", None),
        "message.timestamp.after.max.ms": ("120000", "cluster", None),
        "max.message.bytes": ("5000", "cluster", None),
        "segment.bytes": ("2097152", "cluster", None),
    }
    assert shown[plain] == {
        "cleanup.policy": ("delete", "cluster default", None),
        "message.timestamp.type": ("CreateTime", "cluster default", None),
        "message.timestamp.before.max.ms": (str(LONG_MAX), "cluster default", None),
        "message.timestamp.after.max.ms": (
            AFTER_MAX_DEFAULT[any_kafka.version],
            "cluster default",
            None,
        ),
        "max.message.bytes": ("1048588", "cluster default", None),
        "segment.bytes": ("1073741824", "cluster default", None),
    }


def test_kafka_3_9s_older_timestamp_setting_stands_for_both_bounds(
    kafka3: KafkaCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """message.timestamp.difference.max.ms (removed in 4.0) applies to a bound left at its
    default (KIP-937), and `kvproxy topics` says which setting the value comes from."""
    topic = kafka3.create_topic(config={"message.timestamp.difference.max.ms": "60000"})
    shown = topics_json(capsys, tmp_path, kafka3, topic)[topic]
    difference = ("60000", "cluster", "message.timestamp.difference.max.ms")
    assert shown["message.timestamp.before.max.ms"] == difference
    assert shown["message.timestamp.after.max.ms"] == difference


def test_the_running_proxy_enforces_the_brokers_settings(
    any_kafka: KafkaCluster, proxy_logs: pytest.LogCaptureFixture
) -> None:
    """A compacted topic with a minute either side and 2000 bytes a batch: the proxy refuses
    the null key, the hour-old record and the large batch itself, with the broker's codes."""
    topic = any_kafka.create_topic(
        config={
            "cleanup.policy": "compact",
            "message.timestamp.before.max.ms": "60000",
            "message.timestamp.after.max.ms": "60000",
            "max.message.bytes": "2000",
        }
    )
    with run_proxy(any_kafka.bootstrap_servers) as proxy:
        assert answer(proxy, topic, records()) == 0
        assert not refused_by_proxy(proxy_logs, topic)
        assert answer(proxy, topic, records(key=None)) == INVALID_RECORD
        assert refused_by_proxy(proxy_logs, topic, "compacted_key")
        assert answer(proxy, topic, records(age_ms=HOUR_MS)) == INVALID_TIMESTAMP
        assert refused_by_proxy(proxy_logs, topic, "timestamps")
        assert answer(proxy, topic, records(size=3000)) == MESSAGE_TOO_LARGE
        assert refused_by_proxy(proxy_logs, topic, "batch_integrity")


def test_changes_made_with_incremental_alter_configs_reach_the_running_proxy(
    any_kafka: KafkaCluster,
    proxy_logs: pytest.LogCaptureFixture,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each setting changed on the broker while the proxy runs is enforced by the proxy once
    its cached answer expires (`topic_configs.ttl_ms`), and a setting deleted again (back to
    the broker's default) stops being enforced."""
    topic = any_kafka.create_topic()
    changes: list[tuple[dict[str, str | None], bytes, str, int]] = [
        ({"cleanup_policy": "compact"}, records(key=None), "compacted_key", INVALID_RECORD),
        ({"max_message_bytes": "2000"}, records(size=3000), "batch_integrity", MESSAGE_TOO_LARGE),
        (
            {"message_timestamp_before_max_ms": "60000"},
            records(age_ms=HOUR_MS),
            "timestamps",
            INVALID_TIMESTAMP,
        ),
        (
            {"message_timestamp_after_max_ms": "60000"},
            records(age_ms=-HOUR_MS // 2),
            "timestamps",
            INVALID_TIMESTAMP,
        ),
    ]
    with run_proxy(any_kafka.bootstrap_servers, topic_configs={"ttl_ms": 500}) as proxy:
        for setting, raw, policy, code in changes:
            assert until_forwarded(proxy_logs, proxy, topic, raw) == 0  # not yet refused
            alter(any_kafka, topic, **setting)
            assert until_refused_by_proxy(proxy_logs, proxy, topic, raw, policy=policy) == code
        shown = topics_json(capsys, tmp_path, any_kafka, topic)[topic]
        assert shown["cleanup.policy"] == ("compact", "cluster", None)
        assert shown["max.message.bytes"] == ("2000", "cluster", None)
        assert shown["message.timestamp.before.max.ms"] == ("60000", "cluster", None)
        assert shown["message.timestamp.after.max.ms"] == ("60000", "cluster", None)

        # LogAppendTime: the broker stamps the records, so no bound applies to the client's
        stale = records(age_ms=HOUR_MS)
        alter(any_kafka, topic, message_timestamp_type="LogAppendTime")
        assert until_forwarded(proxy_logs, proxy, topic, records(key=b"k", age_ms=HOUR_MS)) == 0
        # deleted: back to the broker's defaults, which refuse none of them
        alter(
            any_kafka,
            topic,
            cleanup_policy=None,
            max_message_bytes=None,
            message_timestamp_type=None,
            message_timestamp_before_max_ms=None,
            message_timestamp_after_max_ms=None,
        )
        for setting, raw, _, _ in changes:
            assert until_forwarded(proxy_logs, proxy, topic, raw) == 0, setting
        assert until_forwarded(proxy_logs, proxy, topic, stale) == 0
