"""Topic settings learned from Tansu: topics created with configs (CreateTopics, through
confluent-kafka's and kafka-python's admin clients), then read back by `kvproxy topics` and by
a running proxy, and applied to what real producers send through it.

Tansu stores a topic's configs and reports them in DescribeConfigs (source 5, the only ones it
reports); it validates nothing on produce, so every refusal seen here is the proxy's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvproxy.cli import main as kvproxy
from kvproxy.journal import segment_name
from kvproxy.policies.api import TopicConfig
from kvproxy.policies.config import build_routing
from kvproxy.protocol.journal import encode_entry
from kvproxy.protocol.records import build_batch
from kvproxy.proxy.config.proxy_config import TopicConfigsConfig
from tests.harness import Broker, free_port
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.quarantine import new_entry

LONG_MAX = 2**63 - 1
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


def create_with_kafka_python(bootstrap: str, name: str, configs: dict[str, str]) -> str:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics(
            [NewTopic(name, num_partitions=1, replication_factor=1, topic_configs=configs)]
        )
    finally:
        admin.close()
    return name


def write_config(tmp_path: Path, upstream: str, topics: list[dict[str, Any]]) -> Path:
    path = tmp_path / "kvproxy.yaml"
    path.write_text(json.dumps({"upstream": {"bootstrap_servers": [upstream]}, "topics": topics}))
    return path


def topics_json(
    capsys: pytest.CaptureFixture[str], path: Path, *topics: str
) -> tuple[int, dict[str, Any]]:
    code = kvproxy(["topics", "-c", str(path), "--json", *topics])
    return code, json.loads(capsys.readouterr().out)


def rows(document: dict[str, Any], topic: str) -> dict[str, tuple[str, str, str | None]]:
    (entry,) = [t for t in document["topics"] if t["topic"] == topic]
    return {s["name"]: (s["value"], s["source"], s["via"]) for s in entry["settings"]}


def send(bootstrap: str, topic: str, value: bytes, timestamp_ms: int | None = None) -> Any:
    """One record produced with confluent-kafka; its delivery error (None: written)."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 10_000}
    )
    errors: list[Any] = []
    options: dict[str, Any] = {} if timestamp_ms is None else {"timestamp": timestamp_ms}
    producer.produce(
        topic, key=b"k", value=value, on_delivery=lambda e, _m: errors.append(e), **options
    )
    assert producer.flush(15) == 0
    return errors[0]


def learned(proxy: RunningProxy, topic: str) -> TopicConfig:
    """The settings the running proxy's checks of `topic` read (YAML over cluster)."""

    async def read() -> TopicConfig:
        engine = proxy.server.decisions.engine
        assert engine is not None
        return engine.views.config_for(topic)

    return proxy.call(read())


# ---- kvproxy topics ----


def test_kvproxy_topics_shows_each_setting_its_value_and_where_it_comes_from(
    tansu: Broker,
    make_topic: Callable[..., str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stamped = make_topic(
        config={
            "message.timestamp.type": "LogAppendTime",
            "max.message.bytes": "2048",
            "cleanup.policy": "compact",
        }
    )
    older = create_with_kafka_python(
        tansu.bootstrap,
        f"{stamped}-older",
        {"message.timestamp.difference.max.ms": "60000", "segment.bytes": "1048576"},
    )
    path = write_config(
        tmp_path, tansu.bootstrap, [{"match": stamped, "config": {"max.message.bytes": 4096}}]
    )
    code, document = topics_json(capsys, path, stamped, older, "never-created")
    assert code == 0 and document["cluster"] == "answered"
    assert rows(document, stamped) == {
        "cleanup.policy": ("compact", "cluster", None),
        "message.timestamp.type": ("LogAppendTime", "cluster", None),
        "message.timestamp.before.max.ms": (str(LONG_MAX), "Kafka default", None),
        "message.timestamp.after.max.ms": (str(HOUR_MS), "Kafka default", None),
        "max.message.bytes": ("4096", "yaml", None),  # the YAML wins over the cluster's 2048
        "segment.bytes": ("1073741824", "Kafka default", None),
    }
    difference = ("60000", "cluster", "message.timestamp.difference.max.ms")
    assert rows(document, older)["message.timestamp.before.max.ms"] == difference
    assert rows(document, older)["message.timestamp.after.max.ms"] == difference
    assert rows(document, older)["segment.bytes"] == ("1048576", "cluster", None)
    (missing,) = [t for t in document["topics"] if t["topic"] == "never-created"]
    assert missing["exists"] is False
    assert {s["source"] for s in missing["settings"]} == {"Kafka default"}

    assert kvproxy(["topics", "-c", str(path), stamped]) == 0
    text = capsys.readouterr().out
    assert f"{stamped}: rule {stamped}, mode enforce" in text
    assert any(
        line.split() == ["max.message.bytes", "4096", "yaml", "read", "by", "batch_integrity"]
        for line in text.splitlines()
    ), text


def test_kvproxy_topics_lists_every_topic_of_the_cluster_when_none_is_named(
    tansu: Broker,
    make_topic: Callable[..., str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = make_topic(config={"segment.bytes": "1048576"})
    code, document = topics_json(capsys, write_config(tmp_path, tansu.bootstrap, []))
    assert code == 0
    assert rows(document, topic)["segment.bytes"] == ("1048576", "cluster", None)


def test_kvproxy_topics_without_a_cluster_shows_the_yaml_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(
        tmp_path,
        f"127.0.0.1:{free_port()}",  # nothing listens
        [{"match": "orders", "config": {"message.timestamp.type": "LogAppendTime"}}],
    )
    code = kvproxy(["topics", "-c", str(path), "--json", "orders"])
    captured = capsys.readouterr()
    assert code == 1
    assert "the cluster did not answer" in captured.err
    document = json.loads(captured.out)
    assert rows(document, "orders")["message.timestamp.type"] == ("LogAppendTime", "yaml", None)
    assert rows(document, "orders")["max.message.bytes"] == ("1048588", "Kafka default", None)


# ---- the running proxy learns them ----


def test_the_proxy_learns_a_topics_settings_and_the_yaml_wins(
    tansu: Broker, make_topic: Callable[..., str]
) -> None:
    stamped = make_topic(
        config={"message.timestamp.type": "LogAppendTime", "max.message.bytes": "4096"}
    )
    overridden = make_topic(config={"max.message.bytes": "4096", "segment.bytes": "1048576"})
    topics = [{"match": overridden, "config": {"max.message.bytes": 8192}, "compacted": True}]
    with run_proxy(tansu.bootstrap, topics=topics) as proxy:
        for topic in (stamped, overridden):
            assert send(proxy.bootstrap, topic, b"small") is None
        assert learned(proxy, stamped) == TopicConfig(
            compacted=False, timestamp_type="LogAppendTime", max_message_bytes=4096
        )
        assert learned(proxy, overridden) == TopicConfig(
            compacted=True, max_message_bytes=8192, segment_bytes=1_048_576
        )


# ---- what producers see (the checks read the learned settings) ----


def test_a_batch_over_the_learned_max_message_bytes_is_refused(
    tansu: Broker, make_topic: Callable[..., str]
) -> None:
    from confluent_kafka import KafkaError

    small = make_topic(config={"max.message.bytes": "2048"})
    allowed = make_topic(config={"max.message.bytes": "2048"})
    topics = [{"match": allowed, "config": {"max.message.bytes": 1_000_000}}]
    with run_proxy(tansu.bootstrap, topics=topics) as proxy:
        refused = send(proxy.bootstrap, small, b"x" * 5000)
        assert refused is not None and refused.code() == KafkaError.MSG_SIZE_TOO_LARGE, refused
        assert send(proxy.bootstrap, small, b"x" * 100) is None
        assert send(proxy.bootstrap, allowed, b"x" * 5000) is None  # the YAML's bound


def test_old_timestamps_are_refused_by_the_learned_bounds_and_not_on_log_append_time(
    tansu: Broker, make_topic: Callable[..., str]
) -> None:
    from confluent_kafka import KafkaError

    bounded = make_topic(config={"message.timestamp.before.max.ms": "60000"})
    older = create_with_kafka_python(
        tansu.bootstrap, f"{bounded}-older", {"message.timestamp.difference.max.ms": "60000"}
    )
    appended = make_topic(
        config={"message.timestamp.type": "LogAppendTime", "message.timestamp.before.max.ms": "1"}
    )
    yesterday = int(time.time() * 1000) - DAY_MS
    with run_proxy(tansu.bootstrap) as proxy:
        for topic in (bounded, older):
            refused = send(proxy.bootstrap, topic, b"v", timestamp_ms=yesterday)
            assert refused is not None and refused.code() == KafkaError.INVALID_TIMESTAMP, (
                topic,
                refused,
            )
        assert send(proxy.bootstrap, appended, b"v", timestamp_ms=yesterday) is None


def test_a_future_timestamp_within_the_learned_after_bound_is_accepted(
    tansu: Broker, make_topic: Callable[..., str]
) -> None:
    """Kafka's default (and the timestamps policy's) allows one hour ahead; a topic set to a
    day accepts a record two hours ahead, and a topic left at the default refuses it."""
    from confluent_kafka import KafkaError

    lenient = make_topic(config={"message.timestamp.after.max.ms": str(DAY_MS)})
    strict = make_topic()
    ahead = int(time.time() * 1000) + 2 * HOUR_MS
    with run_proxy(tansu.bootstrap) as proxy:
        assert send(proxy.bootstrap, lenient, b"v", timestamp_ms=ahead) is None
        refused = send(proxy.bootstrap, strict, b"v", timestamp_ms=ahead)
        assert refused is not None and refused.code() == KafkaError.INVALID_TIMESTAMP, refused


def test_replay_checks_a_journaled_batch_against_the_learned_settings(
    tansu: Broker,
    make_topic: Callable[..., str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`kvproxy quarantine replay` re-checks with the settings the proxy would use: a batch over
    the topic's max.message.bytes (learned from the cluster) still fails, a small one passes."""
    topic = make_topic(config={"max.message.bytes": "2048"})
    journal = tmp_path / "journal"
    journal.mkdir()
    large, small = (
        new_entry(
            "rejected",
            topic,
            0,
            policy="x",
            code=87,
            records=build_batch([(b"k", value, None, None)]),
        )
        for value in (b"x" * 5000, b"x" * 10)
    )
    (journal / segment_name(0)).write_bytes(
        b"".join(encode_entry(e.to_metadata(), e.records) for e in (large, small))
    )
    config = tmp_path / "kvproxy.yaml"
    config.write_text(
        json.dumps(
            {
                "upstream": {"bootstrap_servers": [tansu.bootstrap]},
                "quarantine": {"dir": str(journal)},
            }
        )
    )
    assert kvproxy(["quarantine", "replay", "-c", str(config), "--topic", topic]) == 1
    out = capsys.readouterr().out
    assert f"{large.id} {topic}-0: still fails: policy batch_integrity, code 10 " in out, out
    assert f"{small.id} {topic}-0: passes now" in out, out


def test_a_reload_changes_how_long_the_cluster_answer_is_trusted(
    tansu: Broker, make_topic: Callable[..., str]
) -> None:
    """`topic_configs` is reloaded with the policy sections: after a reload to ttl_ms 0 an
    answer is kept no time, so the next request for the topic asks again."""
    before, after = make_topic(), make_topic()
    with run_proxy(tansu.bootstrap) as proxy:
        server = proxy.server

        async def known(topic: str) -> bool:
            return server.topic_configs.known(topic)

        async def reload() -> None:
            config = proxy.config.model_copy(update={"topic_configs": TopicConfigsConfig(ttl_ms=0)})
            server.replace_rules(config, build_routing(None, None, Path("."))).close()

        assert send(proxy.bootstrap, before, b"v") is None
        assert proxy.call(known(before))
        proxy.call(reload())
        assert send(proxy.bootstrap, after, b"v") is None
        assert not proxy.call(known(after))
