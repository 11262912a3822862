"""Topic settings: a DescribeConfigs answer and a YAML `config:` mapping read into a
`TopicConfig` (`kvproxy.policies.topic_settings`), the routing's override, the cache, and what
`ProduceEngine` hands the policies."""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any

import pytest
from kio.schema.describe_configs.v1.response import (
    DescribeConfigsResourceResult,
    DescribeConfigsResponse,
    DescribeConfigsResult,
)
from kio.static.primitive import i8, i16, i32Timedelta

from kvproxy.cli import main as kvproxy
from kvproxy.client.async_requests import described_topics
from kvproxy.commands.topics import settings_in_force
from kvproxy.policies.api import UNKNOWN_TOPIC_CONFIG, TopicConfig
from kvproxy.policies.config import build_routing
from kvproxy.policies.errors import PolicyConfigError
from kvproxy.policies.topic_settings import (
    KAFKA_DEFAULTS,
    ClusterSetting,
    from_cluster,
)
from kvproxy.protocol.messages import decode_request
from kvproxy.protocol.records import build_batch
from kvproxy.proxy.config.proxy_config import TopicConfigsConfig, load_config_and_rules
from kvproxy.proxy.lookups import topic_configs
from kvproxy.proxy.lookups.topic_configs import TopicConfigCache
from kvproxy.proxy.produce.decision import ProduceSettings
from kvproxy.proxy.produce.engine import ProduceEngine
from kvproxy.settings.loading import ConfigError
from tests.harness.fuzz import produce_request

LONG_MAX = 2**63 - 1
ABSENT_TTL_S = TopicConfigsConfig().absent_ttl_ms / 1000
TOPIC_CONFIG, STATIC_BROKER, DEFAULT_CONFIG = 1, 4, 5


def kafka_answer(**topic_values: str) -> list[ClusterSetting]:
    """What a Kafka broker reports for a topic (every setting, with its source): Kafka's
    defaults (source 5), a broker-wide max.message.bytes (source 4), the topic's own values
    (`topic_values`, dots written as underscores; source 1)."""
    defaults = {
        "cleanup.policy": "delete",
        "message.timestamp.type": "CreateTime",
        "message.timestamp.before.max.ms": str(LONG_MAX),
        "message.timestamp.after.max.ms": str(LONG_MAX),
        "message.timestamp.difference.max.ms": str(LONG_MAX),
        "segment.bytes": "1073741824",
        "retention.ms": "604800000",
    }
    own = {name.replace("_", "."): value for name, value in topic_values.items()}
    settings = [
        ClusterSetting(name, value, DEFAULT_CONFIG)
        for name, value in defaults.items()
        if name not in own
    ]
    settings.append(ClusterSetting("max.message.bytes", "2000000", STATIC_BROKER))
    settings.extend(ClusterSetting(name, value, TOPIC_CONFIG) for name, value in own.items())
    return settings


# ---- the cluster's answer ----


def test_a_kafka_answer_gives_every_setting_and_where_it_comes_from() -> None:
    learned = from_cluster(
        kafka_answer(
            cleanup_policy="compact,delete",
            message_timestamp_type="LogAppendTime",
            message_timestamp_after_max_ms="5000",
        )
    )
    assert learned.config == TopicConfig(
        compacted=True,
        timestamp_type="LogAppendTime",
        timestamp_before_max_ms=LONG_MAX,
        timestamp_after_max_ms=5000,
        max_message_bytes=2_000_000,
        segment_bytes=1_073_741_824,
    )
    assert learned.origins["compacted"] == ("cleanup.policy", "compact,delete", "cluster")
    assert learned.origins["timestamp_after_max_ms"][2] == "cluster"
    assert learned.origins["max_message_bytes"] == (
        "max.message.bytes",
        "2000000",
        "cluster default",
    )
    assert learned.origins["segment_bytes"][2] == "cluster default"
    unset = from_cluster(kafka_answer()).origins  # a Kafka 3 broker: after.max.ms Long.MAX_VALUE
    assert unset["timestamp_after_max_ms"] == (
        "message.timestamp.after.max.ms",
        str(LONG_MAX),
        "cluster default",
    )


def test_the_older_difference_setting_stands_for_a_bound_left_at_its_default() -> None:
    """KIP-937 (LogConfig 3.6-3.9): message.timestamp.difference.max.ms bounds a side whose own
    setting is Long.MAX_VALUE; a side set to anything else keeps its own value."""
    learned = from_cluster(
        kafka_answer(
            message_timestamp_difference_max_ms="1000",
            message_timestamp_after_max_ms="7000",
        )
    )
    assert learned.config.timestamp_before_max_ms == 1000
    assert learned.config.timestamp_after_max_ms == 7000
    assert learned.origins["timestamp_before_max_ms"][0] == "message.timestamp.difference.max.ms"
    assert learned.origins["timestamp_after_max_ms"][0] == "message.timestamp.after.max.ms"


def test_a_tansu_answer_names_only_what_the_topic_sets() -> None:
    """Tansu reports a topic's own settings with source 5 (DEFAULT_CONFIG) and nothing else:
    a value that is not Kafka's default is the topic's own; the rest stays unknown, except
    cleanup.policy, which unset means delete."""
    learned = from_cluster(
        [
            ClusterSetting("max.message.bytes", "2048", DEFAULT_CONFIG),
            ClusterSetting("message.timestamp.difference.max.ms", "1000", DEFAULT_CONFIG),
        ]
    )
    assert learned.config == TopicConfig(
        compacted=False,
        timestamp_before_max_ms=1000,
        timestamp_after_max_ms=1000,
        max_message_bytes=2048,
    )
    assert learned.origins["max_message_bytes"] == ("max.message.bytes", "2048", "cluster")
    assert "compacted" not in learned.origins
    assert from_cluster([]).config == TopicConfig(compacted=False)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max.message.bytes", "lots"),
        ("max.message.bytes", "-1"),
        ("max.message.bytes", str(2**31)),
        ("segment.bytes", "13"),
        ("message.timestamp.type", "WallClock"),
        ("message.timestamp.before.max.ms", None),
        ("message.timestamp.after.max.ms", "1e3"),
    ],
)
def test_a_value_that_does_not_parse_is_left_unknown(name: str, value: str | None) -> None:
    learned = from_cluster([ClusterSetting(name, value, TOPIC_CONFIG)])
    assert learned.config == TopicConfig(compacted=False)
    assert learned.origins == {}


def test_the_answer_is_read_per_topic_and_errors_are_not_described() -> None:
    def result(name: str, code: int, configs: tuple[Any, ...] = ()) -> DescribeConfigsResult:
        return DescribeConfigsResult(
            error_code=i16(code),
            error_message=None,
            resource_type=i8(2),
            resource_name=name,
            configs=configs,
        )

    entry = DescribeConfigsResourceResult(
        name="max.message.bytes",
        value="4096",
        read_only=False,
        config_source=i8(1),
        is_sensitive=False,
        synonyms=(),
    )
    answer = DescribeConfigsResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        results=(
            result("small", 0, (entry,)),
            result("missing", 3),
            result("not-asked", 0, (entry,)),
        ),
    )
    described = described_topics(answer, ["small", "missing", "silent"])
    assert described == {
        "small": (ClusterSetting("max.message.bytes", "4096", 1),),
        "missing": None,
        "silent": None,
    }


# ---- the YAML `config:` mapping ----


def routing_for(entry: dict[str, Any], **defaults: Any) -> Any:
    return build_routing(defaults or None, [{"match": "t", **entry}], Path("."))


def problems_of(entry: dict[str, Any]) -> list[str]:
    with pytest.raises(PolicyConfigError) as caught:
        routing_for(entry)
    return [str(problem) for problem in caught.value.problems]


def test_the_config_mapping_takes_kafka_names_and_values() -> None:
    routing = routing_for(
        {
            "config": {
                "message.timestamp.type": "LogAppendTime",
                "message.timestamp.before.max.ms": 86_400_000,
                "message.timestamp.after.max.ms": "60000",
                "max.message.bytes": "2048",
                "segment.bytes": 1_048_576,
                "cleanup.policy": ["compact", "delete"],
            }
        }
    )
    assert routing.config_override("t") == TopicConfig(
        compacted=True,
        timestamp_type="LogAppendTime",
        timestamp_before_max_ms=86_400_000,
        timestamp_after_max_ms=60_000,
        max_message_bytes=2048,
        segment_bytes=1_048_576,
    )
    assert routing.compacted_override("t") is True  # what compacted_key and the audit read
    assert routing.config_override("other") is UNKNOWN_TOPIC_CONFIG
    assert routing.settings_needed("t") == frozenset()  # nothing left to ask the cluster


def test_compacted_keeps_working_and_the_difference_setting_fills_both_bounds() -> None:
    routing = routing_for(
        {"compacted": False, "config": {"message.timestamp.difference.max.ms": 1000}}
    )
    assert routing.compacted_override("t") is False
    assert routing.config_override("t") == TopicConfig(
        compacted=False, timestamp_before_max_ms=1000, timestamp_after_max_ms=1000
    )
    assert routing.config_override("t").over(KAFKA_DEFAULTS).timestamp_type == "CreateTime"


def test_what_the_cluster_is_asked_for_follows_the_policies_and_the_yaml() -> None:
    default = routing_for({})
    assert default.settings_needed("any") == frozenset(
        {
            "compacted",
            "timestamp_type",
            "timestamp_before_max_ms",
            "timestamp_after_max_ms",
            "max_message_bytes",
            "segment_bytes",
        }
    )
    assert routing_for({"mode": "off"}).settings_needed("t") == frozenset()
    drop = {"default_policies": "drop"}
    assert routing_for({**drop, "policies": ["crc", "json"]}).settings_needed("t") == frozenset()
    keyed = routing_for({**drop, "compacted": True, "policies": ["crc", "compacted_key"]})
    assert keyed.settings_needed("t") == frozenset()  # as before: compacted: says it all
    only_key = routing_for({**drop, "policies": ["compacted_key"]})
    assert only_key.settings_needed("t") == {"compacted"}


def test_wrong_settings_are_named_with_their_path() -> None:
    problems = problems_of(
        {
            "config": {
                "max.mesage.bytes": 10,
                "segment.bytes": 3,
                "message.timestamp.type": "createtime",
                "message.timestamp.after.max.ms": True,
                "cleanup.policy": "compacted",
                "message.timestamp.before.max.ms": -5,
            }
        }
    )
    assert problems == [
        "topics[0].config.max.mesage.bytes: unknown topic setting "
        "(did you mean 'max.message.bytes'?)",
        "topics[0].config: segment.bytes must be a whole number from 14 to 2,147,483,647, not 3",
        "topics[0].config: message.timestamp.type must be CreateTime or LogAppendTime, "
        "not 'createtime'",
        "topics[0].config: message.timestamp.after.max.ms must be a whole number from 0 to "
        "9,223,372,036,854,775,807, not True",
        "topics[0].config: cleanup.policy must be compact, delete or both (a list, or one "
        "string with commas), not 'compacted'",
        "topics[0].config: message.timestamp.before.max.ms must be a whole number from 0 to "
        "9,223,372,036,854,775,807, not -5",
    ]
    assert problems_of({"config": ["max.message.bytes"]}) == [
        "topics[0]: config must be a mapping, not a list"
    ]
    assert problems_of({"compacted": True, "config": {"cleanup.policy": "delete"}}) == [
        "topics[0]: compacted and config.cleanup.policy both say whether the topic is "
        "compacted: keep one"
    ]


def test_a_file_reports_a_wrong_setting_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "kvproxy.yaml"
    path.write_text(
        "upstream: {bootstrap_servers: ['127.0.0.1:9092']}\n"
        "topics:\n"
        "  - match: orders\n"
        "    config:\n"
        "      message.timestamp.type: LogAppendTime\n"
        "      max.message.bytes: big\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config_and_rules(path)
    assert f"{path}:6: topics[0].config: max.message.bytes must be a whole number" in str(
        caught.value
    )


# ---- the cache ----


def test_the_cache_keeps_each_topic_settings_and_compaction_reads_them() -> None:
    cache = TopicConfigCache(lambda: [], None, ttl_s=60, timeout_s=1)
    learned = TopicConfig(compacted=True, max_message_bytes=2048)
    cache.put("t", learned)
    cache.put("old", False)  # a bool: the compaction alone, as before
    cache.put("gone", None, ttl_s=0)
    assert cache.config("t") is learned
    assert cache.compacted("t") is True
    assert cache.config("old") == TopicConfig(compacted=False)
    assert cache.config("gone") is UNKNOWN_TOPIC_CONFIG
    assert cache.config("never") is UNKNOWN_TOPIC_CONFIG
    assert not cache.known("gone")


async def test_what_the_cluster_answers_is_kept_for_the_ttl_and_a_failure_for_the_short_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def describe(
        host: str, port: int, context: object, timeout: float, topics: list[str]
    ) -> dict[str, tuple[ClusterSetting, ...] | None]:
        if port == 1:
            raise ConnectionRefusedError("nothing listens")
        return {
            "small": (ClusterSetting("max.message.bytes", "2048", TOPIC_CONFIG),),
            "denied": None,  # an error for that topic
        }

    monkeypatch.setattr(topic_configs, "describe_topic_configs", describe)
    cache = TopicConfigCache(lambda: [("h", 1), ("h", 2)], None, ttl_s=60, timeout_s=1)
    await cache.refresh(["small", "denied"])  # the first server fails, the second answers
    assert cache.config("small") == TopicConfig(compacted=False, max_message_bytes=2048)
    assert cache.config("denied") is UNKNOWN_TOPIC_CONFIG and cache.known("denied")
    expiry = {topic: entry[1] - time.monotonic() for topic, entry in cache._entries.items()}
    unknown = {topic: until - time.monotonic() for topic, until in cache._unknown.items()}
    assert unknown["denied"] <= ABSENT_TTL_S < expiry["small"] <= 60
    failing = TopicConfigCache(lambda: [("h", 1)], None, ttl_s=60, timeout_s=1)
    await failing.refresh(["t"])
    assert failing.known("t") and failing.config("t") is UNKNOWN_TOPIC_CONFIG
    assert failing._unknown["t"] - time.monotonic() <= ABSENT_TTL_S


# ---- what the policies are given ----


def test_the_engine_gives_each_partition_the_yaml_settings_over_the_cluster_ones() -> None:
    routing = build_routing(
        None,
        [{"match": "orders", "config": {"max.message.bytes": 4096}, "mode": "warn"}],
        Path("."),
    )
    learned = {
        "orders": TopicConfig(compacted=True, max_message_bytes=100, segment_bytes=1 << 20),
        "logs": TopicConfig(timestamp_type="LogAppendTime"),
    }
    engine = ProduceEngine(
        routing,
        ProduceSettings(),
        lambda topic: learned.get(topic, UNKNOWN_TOPIC_CONFIG).compacted,
        lambda topic: learned.get(topic, UNKNOWN_TOPIC_CONFIG),
    )
    batch = build_batch([(b"k", b"v", None, None)])
    frame = produce_request(9, 1, [("orders", 0, batch), ("logs", 0, batch), ("new", 0, batch)])
    request = decode_request(frame)
    expected = {
        "orders": TopicConfig(compacted=True, max_message_bytes=4096, segment_bytes=1 << 20),
        "logs": TopicConfig(timestamp_type="LogAppendTime"),
        "new": UNKNOWN_TOPIC_CONFIG,
    }
    for topics in (None, engine.views.of_request(request)):  # inline, and off the loop
        decision = engine.decide(frame, request, topics=topics)
        seen = {o.topic: o.produced.topic_config for o in decision.outcomes if o.produced}
        assert seen == expected
        compaction = {o.topic: o.produced.compacted for o in decision.outcomes if o.produced}
        assert compaction == {"orders": True, "logs": None, "new": None}
    assert engine.views.config_for("orders").compacted is True


def test_settings_in_force_say_where_each_value_comes_from() -> None:
    routing = build_routing(
        None, [{"match": "t", "config": {"max.message.bytes": 4096}}], Path(".")
    )
    cluster = from_cluster(kafka_answer(message_timestamp_difference_max_ms="1000"))
    rows = {row.name: row for row in settings_in_force(routing.rule_for("t"), cluster)}
    assert (rows["max.message.bytes"].value, rows["max.message.bytes"].source) == ("4096", "yaml")
    before = rows["message.timestamp.before.max.ms"]
    assert (before.value, before.source, before.via) == (
        "1000",
        "cluster",
        "message.timestamp.difference.max.ms",
    )
    assert rows["segment.bytes"].source == "cluster default"
    assert rows["cleanup.policy"].read_by == ("compacted_key",)
    unknown = {row.name: row for row in settings_in_force(routing.rule_for("other"), None)}
    assert {row.source for row in unknown.values()} == {"Kafka default"}
    assert unknown["message.timestamp.after.max.ms"].value == "3600000"


def test_a_timestamps_option_set_in_the_yaml_stands_for_the_topic_setting() -> None:
    """The timestamps policy reads its own option when the YAML sets it: the cluster is not
    asked for that setting, and `kvproxy topics` names the option."""
    every = {"before_max_ms": 1000, "after_max_ms": 10, "type": "CreateTime"}
    drop = {"default_policies": "drop"}
    whole = routing_for({**drop, "policies": [{"timestamps": every}]})
    assert whole.settings_needed("t") == frozenset()
    partial = routing_for({**drop, "policies": [{"timestamps": {"before_max_ms": 1000}}]})
    assert partial.settings_needed("t") == {"timestamp_type", "timestamp_after_max_ms"}
    rows = {row.name: row for row in settings_in_force(partial.rule_for("t"), None)}
    before = rows["message.timestamp.before.max.ms"]
    assert before.read_by == ()
    assert before.options == ("timestamps uses its option before_max_ms = 1000",)
    assert rows["message.timestamp.after.max.ms"].read_by == ("timestamps",)


def test_check_lists_the_settings_an_entry_sets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "kvproxy.yaml"
    path.write_text(
        "upstream: {bootstrap_servers: ['127.0.0.1:9092']}\n"
        "topics:\n"
        "  - {match: orders, config: {max.message.bytes: 4096, cleanup.policy: compact}}\n"
    )
    assert kvproxy(["check", "-c", str(path)]) == 0
    assert (
        "    orders: mode enforce, compacted yes, settings: max.message.bytes 4096, policies: "
        in capsys.readouterr().out
    )
