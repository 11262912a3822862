"""Kafka's topic settings that decide what a broker accepts, read into a `TopicConfig`.

Two sources speak Kafka's names and Kafka's string values: a DescribeConfigs answer (the
cluster's view, `from_cluster`) and a topic entry's `config:` mapping in the YAML
(`from_yaml`, which says what is wrong with each value). Both resolve
`message.timestamp.difference.max.ms` the way Kafka 3.6-3.9's LogConfig does (KIP-937): it
applies to a side whose own setting (`message.timestamp.before.max.ms`, `...after.max.ms`) is
left at its default, Long.MAX_VALUE. Kafka 4.0 dropped the older setting; its brokers never
report it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from kvproxy.policies.api import TopicConfig

__all__ = [
    "CLEANUP_POLICY",
    "CONFIG_SOURCES",
    "FIELD_NAMES",
    "KAFKA_DEFAULTS",
    "MAX_MESSAGE_BYTES",
    "SEGMENT_BYTES",
    "SETTING_NAMES",
    "TIMESTAMP_AFTER_MAX_MS",
    "TIMESTAMP_BEFORE_MAX_MS",
    "TIMESTAMP_DIFFERENCE_MAX_MS",
    "TIMESTAMP_TYPE",
    "ClusterSetting",
    "ClusterTopic",
    "SettingError",
    "from_cluster",
    "from_yaml",
]

CLEANUP_POLICY: Final = "cleanup.policy"
TIMESTAMP_TYPE: Final = "message.timestamp.type"
TIMESTAMP_BEFORE_MAX_MS: Final = "message.timestamp.before.max.ms"
TIMESTAMP_AFTER_MAX_MS: Final = "message.timestamp.after.max.ms"
TIMESTAMP_DIFFERENCE_MAX_MS: Final = "message.timestamp.difference.max.ms"
MAX_MESSAGE_BYTES: Final = "max.message.bytes"
SEGMENT_BYTES: Final = "segment.bytes"

SETTING_NAMES: Final = (
    CLEANUP_POLICY,
    TIMESTAMP_TYPE,
    TIMESTAMP_BEFORE_MAX_MS,
    TIMESTAMP_AFTER_MAX_MS,
    TIMESTAMP_DIFFERENCE_MAX_MS,
    MAX_MESSAGE_BYTES,
    SEGMENT_BYTES,
)
"""The topic settings kvproxy reads, by Kafka's names (the keys of a topic entry's `config:`)."""

FIELD_NAMES: Final[Mapping[str, str]] = {
    "compacted": CLEANUP_POLICY,
    "timestamp_type": TIMESTAMP_TYPE,
    "timestamp_before_max_ms": TIMESTAMP_BEFORE_MAX_MS,
    "timestamp_after_max_ms": TIMESTAMP_AFTER_MAX_MS,
    "max_message_bytes": MAX_MESSAGE_BYTES,
    "segment_bytes": SEGMENT_BYTES,
}
"""`TopicConfig` field -> the Kafka setting it holds, in the order `kvproxy topics` lists them."""

_LONG_MAX: Final = 2**63 - 1
_INT_MAX: Final = 2**31 - 1
_TIMESTAMP_TYPES: Final = ("CreateTime", "LogAppendTime")
_CLEANUP_POLICIES: Final = ("compact", "delete")

KAFKA_DEFAULTS: Final = TopicConfig(
    compacted=False,
    timestamp_type="CreateTime",
    timestamp_before_max_ms=_LONG_MAX,
    timestamp_after_max_ms=3_600_000,
    max_message_bytes=1_048_588,
    segment_bytes=1_073_741_824,
)
"""What a Kafka 4.0 broker applies to a topic that sets nothing and a cluster that changes no
default (LogConfig; after.max.ms was Long.MAX_VALUE before 4.0, KIP-1030). What a check uses
when neither the YAML nor the cluster says."""

CONFIG_SOURCES: Final[Mapping[int, str]] = {
    1: "cluster",  # TOPIC_CONFIG: set on the topic
    2: "cluster default",  # DYNAMIC_BROKER_CONFIG
    3: "cluster default",  # DYNAMIC_DEFAULT_BROKER_CONFIG
    4: "cluster default",  # STATIC_BROKER_CONFIG
    5: "cluster default",  # DEFAULT_CONFIG: the broker's built-in default
}
"""DescribeConfigs `config_source` -> where `kvproxy topics` says a value comes from."""
_DEFAULT_CONFIG: Final = 5
_EARLIER_DEFAULTS: Final[Mapping[str, frozenset[object]]] = {
    "timestamp_after_max_ms": frozenset({_LONG_MAX}),  # before Kafka 4.0
    "max_message_bytes": frozenset({1_000_012}),  # before Kafka 2.0
}
"""Defaults of earlier Kafka versions, which their brokers report as built-in defaults."""


class SettingError(ValueError):
    """A value a setting cannot have (the message says what it must be)."""


@dataclass(frozen=True, slots=True)
class ClusterSetting:
    """One entry of a DescribeConfigs answer."""

    name: str
    value: str | None
    source: int = -1
    """Kafka's ConfigSource (1 topic, 2-4 broker, 5 built-in default); -1 when not said."""


@dataclass(frozen=True, slots=True)
class ClusterTopic:
    """What the cluster says about one topic's settings, by `TopicConfig` field."""

    config: TopicConfig
    origins: Mapping[str, tuple[str, str, str]]
    """field -> (the Kafka setting whose value is in force, that value as the cluster wrote it,
    where it comes from: "cluster" or "cluster default"), for the fields the cluster gave."""


def _whole_number(minimum: int, maximum: int) -> Callable[[object], int]:
    def parse(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise SettingError(f"must be a whole number from {minimum:,} to {maximum:,}")
        if isinstance(value, str):
            text = value.strip()
            body = text[1:] if text[:1] in "+-" else text
            if not body.isascii() or not body.isdigit() or len(body) > 20:
                raise SettingError(f"must be a whole number from {minimum:,} to {maximum:,}")
            value = int(text)
        if not minimum <= value <= maximum:
            raise SettingError(f"must be a whole number from {minimum:,} to {maximum:,}")
        return value

    return parse


def _timestamp_type(value: object) -> str:
    if value not in _TIMESTAMP_TYPES:
        raise SettingError("must be CreateTime or LogAppendTime")
    return str(value)


def _compacted(value: object) -> bool:
    """`cleanup.policy` ("compact", "delete", "compact,delete" or a list of them) -> compacted."""
    if isinstance(value, str):
        items: list[object] = [item.strip() for item in value.split(",")]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise SettingError("must be compact, delete or both (a list, or one string with commas)")
    if not items or any(item not in _CLEANUP_POLICIES for item in items):
        raise SettingError("must be compact, delete or both (a list, or one string with commas)")
    return "compact" in items


_PARSERS: Final[Mapping[str, Callable[[object], Any]]] = {
    CLEANUP_POLICY: _compacted,
    TIMESTAMP_TYPE: _timestamp_type,
    TIMESTAMP_BEFORE_MAX_MS: _whole_number(0, _LONG_MAX),
    TIMESTAMP_AFTER_MAX_MS: _whole_number(0, _LONG_MAX),
    TIMESTAMP_DIFFERENCE_MAX_MS: _whole_number(0, _LONG_MAX),
    MAX_MESSAGE_BYTES: _whole_number(0, _INT_MAX),
    SEGMENT_BYTES: _whole_number(14, _INT_MAX),  # at least a v0 record's overhead, as Kafka
}


def _effective(own: int | None, difference: int | None) -> int | None:
    """KIP-937: a side's own bound unless it is left at Long.MAX_VALUE, then the older one."""
    if own is not None and own != _LONG_MAX:
        return own
    return difference if difference is not None else own


def _config(values: Mapping[str, Any]) -> TopicConfig:
    difference = values.get(TIMESTAMP_DIFFERENCE_MAX_MS)
    return TopicConfig(
        compacted=values.get(CLEANUP_POLICY),
        timestamp_type=values.get(TIMESTAMP_TYPE),
        timestamp_before_max_ms=_effective(values.get(TIMESTAMP_BEFORE_MAX_MS), difference),
        timestamp_after_max_ms=_effective(values.get(TIMESTAMP_AFTER_MAX_MS), difference),
        max_message_bytes=values.get(MAX_MESSAGE_BYTES),
        segment_bytes=values.get(SEGMENT_BYTES),
    )


def from_yaml(section: Mapping[Any, Any], report: Callable[[object, str], None]) -> TopicConfig:
    """A topic entry's `config:` mapping as a `TopicConfig`; `report(key, message)` is told of
    each key that is unknown (the message then carries no hint: the caller adds it) or whose
    value is wrong, and those keys are left out."""
    values: dict[str, Any] = {}
    for key, value in section.items():
        parse = _PARSERS.get(key) if isinstance(key, str) else None
        if parse is None:
            report(key, "unknown setting")
            continue
        try:
            values[key] = parse(value)
        except SettingError as exc:
            report(key, str(exc))
    return _config(values)


def from_cluster(settings: Iterable[ClusterSetting]) -> ClusterTopic:
    """What a DescribeConfigs answer for one topic says. A value that does not parse is left
    unknown; `cleanup.policy` missing counts as "delete" (Kafka's default: not compacted).

    A topic's own value reported as the broker's built-in default (Tansu reports every topic
    setting with source 5) is said to come from the cluster when it differs from Kafka's
    default (this version's or an earlier one's)."""
    values: dict[str, Any] = {}
    written: dict[str, tuple[str, int]] = {}
    for setting in settings:
        parse = _PARSERS.get(setting.name)
        if parse is None or setting.value is None:
            continue
        try:
            values[setting.name] = parse(setting.value)
        except SettingError:
            continue
        written[setting.name] = (setting.value, setting.source)
    config = _config({CLEANUP_POLICY: False, **values})
    origins: dict[str, tuple[str, str, str]] = {}
    for field_name, own_name in FIELD_NAMES.items():
        value = getattr(config, field_name)
        if value is None:
            continue
        name = own_name
        if own_name in (TIMESTAMP_BEFORE_MAX_MS, TIMESTAMP_AFTER_MAX_MS) and (
            own_name not in written or values[own_name] != value
        ):
            name = TIMESTAMP_DIFFERENCE_MAX_MS  # the older setting's value is in force
        if name not in written:  # cleanup.policy not reported: Kafka's default
            continue
        text, source = written[name]
        where = CONFIG_SOURCES.get(source, "cluster")
        defaults = {getattr(KAFKA_DEFAULTS, field_name), *_EARLIER_DEFAULTS.get(field_name, ())}
        if source == _DEFAULT_CONFIG and value not in defaults:
            where = "cluster"  # Tansu's way of reporting the topic's own value
        origins[field_name] = (name, text, where)
    return ClusterTopic(config, origins)
