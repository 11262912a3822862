"""Produce v13 names topics by id (KIP-516); the policies, topic settings, journal, logs and
metrics all speak of topics by name. A v13 request is given names once, where it is read: each
topic of its body becomes a `NamedTopicData` (the id, the name the cluster gives it, the
partitions as sent), which every later step reads as it reads a v3-v12 topic (`name`,
`partition_data`), and which turns back into the schema's own topic when the request is
re-encoded (`as_sent`). Sans-IO: where the names come from is the caller's (`name_of`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from kvproxy.protocol.messages import Request

__all__ = [
    "FIRST_WITH_TOPIC_IDS",
    "NamedTopicData",
    "as_sent",
    "is_unknown_id",
    "name_topics",
    "topic_ids_of",
    "topic_name",
    "unknown_topic_label",
    "unnamed_ids",
]

FIRST_WITH_TOPIC_IDS: Final = 13
"""The first Produce version whose topics are named by id."""


@dataclass(frozen=True, slots=True)
class NamedTopicData:
    """A topic of a v13 request with its name: None when the cluster does not know the id."""

    name: str | None
    topic_id: uuid.UUID | None
    partition_data: tuple[Any, ...]
    sent: Any
    """The schema's own topic, as read from the request."""

    def as_sent(self) -> Any:
        """The schema's topic holding this one's partitions (some may have been dropped)."""
        if self.partition_data is self.sent.partition_data:
            return self.sent
        return dataclasses.replace(self.sent, partition_data=self.partition_data)


def unknown_topic_label(topic_id: uuid.UUID | None) -> str:
    """What logs and metrics call a topic whose id the cluster does not know (never a legal
    topic name, so it is never taken for one)."""
    return f"<unknown topic id {topic_id}>"


def topic_name(topic: Any) -> str:
    """The name of a request's topic, whatever its version: its own, the one its id stands
    for, or (`unknown_topic_label`) what an id the cluster does not know is called."""
    name = topic.name
    if name is None and isinstance(topic, NamedTopicData):
        return unknown_topic_label(topic.topic_id)
    return str(name)


def is_unknown_id(topic: Any) -> bool:
    """Whether the topic is named by an id the cluster does not know (answered UNKNOWN_TOPIC_ID)."""
    return isinstance(topic, NamedTopicData) and topic.name is None


def unnamed_ids(request: Request) -> list[uuid.UUID]:
    """The ids of a named request whose name is not known (yet), each once."""
    ids = (t.topic_id for t in request.body.topic_data if is_unknown_id(t))
    return list(dict.fromkeys(i for i in ids if i is not None))


def topic_ids_of(request: Request) -> list[uuid.UUID]:
    """The ids a v13 request names, each once, in request order (none before v13)."""
    if request.header.api_version < FIRST_WITH_TOPIC_IDS:
        return []
    ids = (t.topic_id for t in request.body.topic_data if not isinstance(t, NamedTopicData))
    return list(dict.fromkeys(i for i in ids if i is not None))


def name_topics(request: Request, name_of: Callable[[uuid.UUID], str | None]) -> Request:
    """The request with every topic named (v13; an earlier version is returned as it is); a
    topic named before keeps its name, one whose id was unknown is looked up again."""
    if request.header.api_version < FIRST_WITH_TOPIC_IDS:
        return request
    topics: Iterable[Any] = request.body.topic_data
    named = tuple(
        (
            dataclasses.replace(topic, name=name_of(topic.topic_id))
            if is_unknown_id(topic) and topic.topic_id is not None
            else topic
        )
        if isinstance(topic, NamedTopicData)
        else NamedTopicData(
            None if topic.topic_id is None else name_of(topic.topic_id),
            topic.topic_id,
            topic.partition_data,
            topic,
        )
        for topic in topics
    )
    return Request(request.header, dataclasses.replace(request.body, topic_data=named))


def as_sent(request: Request) -> Request:
    """The request as the schema encodes it (v13 topics by id again)."""
    topics = request.body.topic_data
    if not any(isinstance(topic, NamedTopicData) for topic in topics):
        return request
    sent = tuple(t.as_sent() if isinstance(t, NamedTopicData) else t for t in topics)
    return Request(request.header, dataclasses.replace(request.body, topic_data=sent))
