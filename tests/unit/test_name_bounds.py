"""Everything keyed by a client-chosen topic name holds a bounded number of entries, never a name
that cannot be a topic, and the quarantine journal's metadata has a bounded size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvproxy.journal import QuarantineEntry
from kvproxy.policies import producer_state
from kvproxy.policies.config import build_routing
from kvproxy.policies.producer_state import ProducerStateTracker
from kvproxy.protocol.journal import encode_entry
from kvproxy.protocol.topics import is_legal_topic_name
from kvproxy.proxy.lookups import topic_configs
from kvproxy.proxy.lookups.topic_configs import TopicConfigCache
from tests.harness.quarantine import new_entry

INVENTED = [f"invented-{n}" for n in range(25_000)]


@pytest.mark.parametrize(
    ("name", "legal"),
    [
        ("orders", True),
        ("a.b_c-D9", True),
        ("x" * 249, True),
        ("x" * 250, False),
        ("", False),
        (".", False),
        ("..", False),
        ("...", True),
        ("bad\nname", False),
        ("with space", False),
        ("caf\u00e9", False),
        ("orders\n", False),
    ],
)
def test_what_a_topic_name_can_be(name: str, legal: bool) -> None:
    assert is_legal_topic_name(name) is legal


def test_the_routing_remembers_a_bounded_number_of_topics_least_recently_used_first() -> None:
    routing = build_routing(None, [{"match": "orders", "mode": "warn"}], Path("."))
    assert routing.mode_for("orders").value == "warn"
    for n, name in enumerate(INVENTED):
        assert routing.mode_for(name).value == "enforce"
        if n % 1000 == 0:
            routing.rule_for("orders")  # used often: stays
        assert routing.cached_topics <= 10_000
    assert routing.cached_topics == 10_000
    cache = routing._cache  # which names are kept
    assert "orders" in cache
    assert INVENTED[0] not in cache
    assert INVENTED[-1] in cache


def test_the_routing_keeps_no_name_that_cannot_be_a_topic() -> None:
    routing = build_routing(None, [{"match": "*", "mode": "warn"}], Path("."))
    for n in range(100):  # matched against no rule: answered as Kafka answers (3)
        assert routing.rule_for("x" * 32_000 + str(n)) is routing.no_such_topic
        assert routing.rule_for(f"bad\nname-{n}") is routing.no_such_topic
    assert routing.cached_topics == 0


def test_the_topic_config_cache_is_bounded_and_keeps_no_name_that_cannot_be_a_topic() -> None:
    cache = TopicConfigCache(lambda: [], None, ttl_s=60, timeout_s=1)
    for name in INVENTED[:12_000]:
        cache.put(name, False)
        assert len(cache._entries) <= topic_configs.MAX_TOPICS
    assert len(cache._entries) == topic_configs.MAX_TOPICS == 10_000
    assert cache.compacted(INVENTED[0]) is None  # the least recently used went first
    assert cache.compacted(INVENTED[11_999]) is False
    long_name = "x" * 32_000
    cache.put(long_name, True)
    assert cache.known(long_name)  # nothing to ask the cluster about it
    assert cache.compacted(long_name) is None  # counts as not compacted, and is not kept
    assert len(cache._entries) == 10_000


def test_producer_state_keeps_no_name_longer_than_a_topic() -> None:
    tracker = ProducerStateTracker(max_producers=100)
    tracker.record_success("x" * 250, 0, producer_id=1, epoch=0, base_sequence=0, last_sequence=0)
    assert len(tracker) == 0
    tracker.record_success("x" * 249, 0, producer_id=1, epoch=0, base_sequence=0, last_sequence=0)
    assert len(tracker) == 1
    assert producer_state.MAX_TOPIC_NAME_CHARS == 249


def test_quarantine_metadata_is_bounded_whatever_the_client_sent() -> None:
    entry = new_entry(
        "rejected",
        "t" * 32_000,
        0,
        client_id="c" * 32_000,
        message="m" * 100_000,
        record_indexes=tuple(range(50_000)),
        records=b"r" * 10,
    )
    metadata = entry.to_metadata()
    assert metadata["topic"] == "t" * 249 + f"...(+{32_000 - 249} chars)"
    assert metadata["client_id"] == "c" * 256 + f"...(+{32_000 - 256} chars)"
    assert metadata["message"] == "m" * 2000 + f"...(+{98_000} chars)"
    assert metadata["record_indexes"] == list(range(1000))
    assert metadata["record_indexes_omitted"] == 49_000
    assert len(json.dumps(metadata)) < 12_000
    assert len(encode_entry(metadata, entry.records)) < 12_000

    back = QuarantineEntry.from_metadata(metadata, entry.records)
    assert back.record_indexes_omitted == 49_000
    assert back.to_metadata() == metadata  # bounded once, stable after


def test_quarantine_metadata_of_an_ordinary_entry_is_unchanged() -> None:
    entry = new_entry(
        "rejected", "orders", 1, client_id="app", message="bad", record_indexes=(0, 2)
    )
    metadata = entry.to_metadata()
    assert "record_indexes_omitted" not in metadata
    assert (metadata["topic"], metadata["client_id"], metadata["message"]) == (
        "orders",
        "app",
        "bad",
    )
    assert QuarantineEntry.from_metadata(metadata) == entry
