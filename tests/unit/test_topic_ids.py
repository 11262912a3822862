"""kvproxy.proxy.lookups.topic_ids: the ids Produce v13 names topics by, learned from the Metadata
answers
clients get, bounded, and asked about within a connection's lookup budget."""

from __future__ import annotations

import uuid

from kvproxy.proxy.config.proxy_config import TopicConfigsConfig
from kvproxy.proxy.lookups.topic_ids import TopicIds


def _ids(**settings: int) -> TopicIds:
    return TopicIds(tuple, None, 1.0, TopicConfigsConfig(**settings), max_ids=3)


def test_learned_ids_name_their_topics_and_the_oldest_go_first() -> None:
    ids = _ids()
    keys = [uuid.UUID(int=n) for n in range(1, 6)]
    ids.learn((k, f"t{n}") for n, k in enumerate(keys[:3]))
    assert ids.name_of(keys[0]) == "t0"  # used: kept longer than keys[1]
    ids.learn([(keys[3], "t3"), (keys[4], "t4")])
    assert [ids.name_of(k) for k in keys] == ["t0", None, None, "t3", "t4"]
    assert ids.missing(keys) == [keys[1], keys[2]]


class _Client:
    """A connection, as the budget keeps it (weakly)."""


def test_a_connection_asks_about_as_many_new_ids_as_its_budget_allows() -> None:
    ids = _ids(lookups_per_client_per_second=1, max_topics_per_request=2)
    wanted = [uuid.UUID(int=n) for n in range(10, 15)]
    client = _Client()
    assert ids.admit(wanted, client) == wanted[:2]  # a burst of one request's worth
    assert ids.admit(wanted, client) == []
    assert ids.admit(wanted, _Client()) == wanted[:2]  # another connection has its own
