"""`kvproxy topics -c FILE [TOPIC...]`: the topic settings the checks use, and their sources.

Each setting a broker applies on produce (`kvproxy.policies.topic_settings`) is taken from the
topic's
YAML entry (`config:`, `compacted:`), else from the cluster (DescribeConfigs: the topic's own
value, or the broker's default), else Kafka's default. The command asks the cluster as `serve`
would (or a temporary embedded broker, as `check --connect` does) and prints, per topic, every
setting with its value, where it comes from and which of the topic's policies read it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvproxy.policies.config import TopicRouting, TopicRule
from kvproxy.policies.topic_settings import (
    FIELD_NAMES,
    KAFKA_DEFAULTS,
    ClusterSetting,
    ClusterTopic,
    from_cluster,
)
from kvproxy.protocol.errors import ProtocolError
from kvproxy.proxy.config.proxy_config import ProxyConfig, load_config_and_rules

YAML = "yaml"
KAFKA_DEFAULT = "Kafka default"


@dataclass(frozen=True, slots=True)
class SettingInForce:
    """One setting of one topic as the checks see it."""

    name: str
    """Kafka's name of the setting."""
    value: str
    source: str
    """yaml, cluster, cluster default or Kafka default."""
    read_by: tuple[str, ...]
    """The topic's policies that read it (none: no check of this topic uses it)."""
    via: str | None = None
    """The older setting whose value stands for this one (message.timestamp.difference.max.ms
    for a timestamp bound the cluster leaves at its default), else None."""
    options: tuple[str, ...] = ()
    """Policies of the topic that use an option of their own instead ("timestamps uses its
    option before_max_ms = 604800000")."""


@dataclass(frozen=True, slots=True)
class TopicReport:
    topic: str
    exists: bool | None
    """Whether the cluster has the topic (None: it did not say)."""
    rule: str
    mode: str
    settings: tuple[SettingInForce, ...]


@dataclass(frozen=True, slots=True)
class ClusterAnswer:
    topics: list[str]
    exists: dict[str, bool | None]
    described: dict[str, tuple[ClusterSetting, ...] | None]
    problem: str | None = None
    """Why the cluster could not be asked (then nothing above is known)."""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "topics",
        help="show the topic settings the checks use (YAML, cluster or Kafka default)",
        description="For each TOPIC (default: every topic the cluster has), the settings a "
        "broker applies on produce, the value kvproxy's checks use and where it comes from: "
        "yaml (config: or compacted: in the topic's entry), cluster (set on the topic), cluster "
        "default (the brokers' default) or Kafka default (the cluster does not say).",
    )
    parser.add_argument("-c", "--config", required=True, help="YAML configuration file")
    parser.add_argument("topics", nargs="*", metavar="TOPIC", help="topics to show")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """0: shown; 1: the cluster did not answer (YAML values and Kafka defaults still shown)."""
    config, routing = load_config_and_rules(args.config)  # a ConfigError: kvproxy's main exits 2
    try:
        answer = ask_cluster(config, list(args.topics))
        reports = [report_for(topic, routing, answer) for topic in answer.topics]
    finally:
        routing.close()
    if args.json:
        document = {
            "cluster": answer.problem or "answered",
            "topics": [
                {
                    "topic": r.topic,
                    "exists": r.exists,
                    "rule": r.rule,
                    "mode": r.mode,
                    "settings": [
                        {
                            "name": s.name,
                            "value": s.value,
                            "source": s.source,
                            "read_by": list(s.read_by),
                            "via": s.via,
                            "options": list(s.options),
                        }
                        for s in r.settings
                    ],
                }
                for r in reports
            ],
        }
        print(json.dumps(document, indent=2))
    else:
        print(render(reports))
    if answer.problem is not None:
        print(f"kvproxy: the cluster did not answer: {answer.problem}", file=sys.stderr)
        return 1
    return 0


def ask_cluster(config: ProxyConfig, topics: list[str]) -> ClusterAnswer:
    """Which of `topics` exist (all the cluster's topics when none are named) and their
    settings, asked of the first bootstrap server that answers (or an embedded broker)."""
    if config.upstream.embedded:
        from kvproxy.proxy.serve.embedded import run_embedded_broker  # noqa: PLC0415

        with run_embedded_broker() as broker:
            return _ask(config, ((broker.host, broker.port),), topics)
    return _ask(config, config.upstream.addresses(), topics)


def _ask(
    config: ProxyConfig, servers: Sequence[tuple[str, int]], topics: list[str]
) -> ClusterAnswer:
    from kvproxy.client.async_requests import (  # noqa: PLC0415
        describe_topic_configs,
        list_topics,
        topics_exist,
    )
    from kvproxy.proxy.cluster.upstream_failures import describe_failure  # noqa: PLC0415
    from kvproxy.proxy.listen.tls_context import upstream_side_ssl  # noqa: PLC0415

    timeout = config.upstream.connect_timeout_ms / 1000
    context = upstream_side_ssl(config)

    async def ask(host: str, port: int) -> ClusterAnswer:
        if topics:
            names = list(dict.fromkeys(topics))
            exists = await topics_exist(host, port, context, timeout, names)
        else:
            names = await list_topics(host, port, context, timeout)
            exists = dict.fromkeys(names, True)
        described = await describe_topic_configs(host, port, context, timeout, names)
        return ClusterAnswer(names, {n: exists.get(n) for n in names}, described)

    problems = []
    for host, port in servers:
        try:
            return asyncio.run(ask(host, port))
        except (OSError, TimeoutError, ProtocolError) as exc:
            problems.append(f"{host}:{port}: {describe_failure(exc, timeout)}")
    names = list(dict.fromkeys(topics))
    return ClusterAnswer(
        names,
        dict.fromkeys(names),
        dict.fromkeys(names),
        "; ".join(problems) or "no bootstrap server",
    )


def report_for(topic: str, routing: TopicRouting, answer: ClusterAnswer) -> TopicReport:
    rule = routing.rule_for(topic)
    settings = answer.described.get(topic)
    exists = answer.exists.get(topic)
    cluster = from_cluster(settings) if settings is not None and exists is not False else None
    return TopicReport(
        topic,
        exists,
        rule.match if rule.match is not None else "(every other topic)",
        rule.mode.value,
        settings_in_force(rule, cluster),
    )


def settings_in_force(rule: TopicRule, cluster: ClusterTopic | None) -> tuple[SettingInForce, ...]:
    """Every setting of `kvproxy.policies.topic_settings`, by precedence: the rule's YAML, the
    cluster's, Kafka's default."""
    rows = []
    declared = rule.chain.declarations
    for field_name, name in FIELD_NAMES.items():
        read_by = tuple(d.name for d in declared if field_name in d.settings_read)
        options = tuple(
            f"{d.name} uses its option {own[0]} = {own[1]}"
            for d in declared
            if (own := d.settings_from_options.get(field_name)) is not None
        )
        mine = getattr(rule.config, field_name)
        if mine is not None:
            value, source, via = _shown(field_name, mine), YAML, None
        elif cluster is not None and field_name in cluster.origins:
            used, value, source = cluster.origins[field_name]
            via = used if used != name else None
        else:
            value, via = _shown(field_name, getattr(KAFKA_DEFAULTS, field_name)), None
            source = KAFKA_DEFAULT
        rows.append(SettingInForce(name, value, source, read_by, via, options))
    return tuple(rows)


def _shown(field_name: str, value: object) -> str:
    if field_name == "compacted":
        return "compact" if value else "delete"
    return str(value)


def render(reports: Sequence[TopicReport]) -> str:
    if not reports:
        return "no topics"
    lines: list[str] = []
    for report in reports:
        where = {True: "", False: " (not on the cluster)", None: " (the cluster did not say)"}
        lines.append(
            f"{report.topic}{where[report.exists]}: rule {report.rule}, mode {report.mode}"
        )
        width = max(len(s.name) for s in report.settings)
        value_width = max(len(s.value) for s in report.settings)
        sources = [s.source if s.via is None else f"{s.source} ({s.via})" for s in report.settings]
        source_width = max(len(source) for source in sources)
        for s, source in zip(report.settings, sources, strict=True):
            uses = ([f"read by {', '.join(s.read_by)}"] if s.read_by else []) + list(s.options)
            checked = "; ".join(uses) or "not checked"
            lines.append(
                f"  {s.name:<{width}}  {s.value:<{value_width}}  "
                f"{source:<{source_width}}  {checked}"
            )
    return "\n".join(lines)


__all__ = ["SettingInForce", "TopicReport", "add_parser", "run", "settings_in_force"]
