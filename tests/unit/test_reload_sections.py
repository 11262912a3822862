"""What a reload applies to a running proxy: the sections declared reloadable, and they alone.

`RELOADABLE_SECTIONS` (kvproxy/proxy/config/proxy_config.py) is the one list: the rule swap copies
those sections and
the reloader warns that every other changed section needs a restart. A reloaded
`topic_configs.ttl_ms` holds for the answers already kept as well as for the next ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvproxy.policies.api import UNKNOWN_TOPIC_CONFIG, TopicConfig
from kvproxy.proxy.config.proxy_config import (
    RELOADABLE_SECTIONS,
    ProxyConfig,
    TopicConfigsConfig,
    build_routing_for,
    parse_config,
)
from kvproxy.proxy.serve.reload import sections_needing_restart
from kvproxy.proxy.serve.server import ProxyServer

UPSTREAM = {"bootstrap_servers": ["kafka:9092"]}
HOUR_MS = 3_600_000
ABSENT_TTL_S = TopicConfigsConfig().absent_ttl_ms / 1000


def _swap(server: ProxyServer, config: ProxyConfig) -> None:
    server.replace_rules(config, build_routing_for(config, Path("."))).close()


def test_a_reload_that_shortens_the_ttl_expires_the_answers_already_kept() -> None:
    server = ProxyServer(parse_config({"upstream": UPSTREAM, "topic_configs": {"ttl_ms": HOUR_MS}}))
    try:
        cache = server.topic_configs
        cache.put("orders", TopicConfig(compacted=True))
        assert cache.known("orders")
        _swap(server, parse_config({"upstream": UPSTREAM, "topic_configs": {"ttl_ms": 0}}))
        assert not cache.known("orders"), "an answer kept under the old TTL is still trusted"
        assert cache.config("orders") is UNKNOWN_TOPIC_CONFIG
    finally:
        server.routing.close()


def test_a_reload_that_lengthens_the_ttl_keeps_the_answers_longer_but_not_the_failures() -> None:
    server = ProxyServer(parse_config({"upstream": UPSTREAM, "topic_configs": {"ttl_ms": 10}}))
    try:
        cache = server.topic_configs
        cache.put("orders", TopicConfig(compacted=True))
        cache.put("unknown", None, ABSENT_TTL_S)  # a failure is kept for its own short time
        _swap(server, parse_config({"upstream": UPSTREAM, "topic_configs": {"ttl_ms": HOUR_MS}}))
        assert cache.ttl_s == HOUR_MS / 1000
        expiry = {topic: entry[1] for topic, entry in cache._entries.items()}
        assert expiry["orders"] - cache._unknown["unknown"] > HOUR_MS / 1000 - ABSENT_TTL_S - 1
    finally:
        server.routing.close()


def test_the_rule_swap_applies_the_reloadable_sections_and_nothing_else() -> None:
    running = parse_config({"upstream": UPSTREAM})
    changed: dict[str, Any] = {
        "upstream": {"bootstrap_servers": ["other:9092"]},
        "limits": {"max_in_flight_requests": 7},
        "errors": {"profile": "kip"},
        "reject": "request",
        "topics": [{"match": "orders", "policies": []}],
        "topic_configs": {"ttl_ms": 5},
    }
    new = parse_config(changed)
    server = ProxyServer(running)
    try:
        _swap(server, new)
        for name in type(running).model_fields:
            source = new if name in RELOADABLE_SECTIONS else running
            assert getattr(server.config, name) == getattr(source, name), name
        assert server.decisions.config == server.config
    finally:
        server.routing.close()
    assert sections_needing_restart(running, new) == ["upstream", "limits"]
