"""Topic settings (compaction, timestamps, sizes) learned from the cluster with DescribeConfigs.

The broker's checks depend on a topic's settings (`policies.topic_settings`): whether it is
compacted, its timestamp type and bounds, its largest batch and segment. Operators should not
have to repeat in kvproxy what the cluster already says. Answers are cached for `ttl`; a topic
the cluster cannot describe (unknown yet, or the request failed) is cached as unknown for a
shorter time, and an unknown setting is left to the check's own default (an unknown compaction
passes `compacted_key`, as a broker would accept it into a new, delete-policy topic).

Clients choose the names, so the cache is bounded: at most `MAX_TOPICS` names (the least recently
used dropped first), and a name that cannot be a topic (`protocol.topics`) is never asked about
or kept: it counts as not compacted, and the broker refuses it anyway.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final

from policies.api import UNKNOWN_TOPIC_CONFIG, TopicConfig
from policies.topic_settings import from_cluster
from protocol.errors import ProtocolError
from protocol.topics import is_legal_topic_name
from proxy.upstream_client import describe_topic_configs

log = logging.getLogger("kvproxy")

UNKNOWN_TTL_S: Final = 5.0
MAX_TOPICS: Final = 10_000
"""Topics whose answer is kept; with names of at most 249 characters, a few MB at most."""


class TopicConfigCache:
    def __init__(
        self,
        bootstrap: Callable[[], Iterable[tuple[str, int]]],
        ssl_context: ssl.SSLContext | None,
        ttl_s: float,
        timeout_s: float,
        max_topics: int | None = None,
    ) -> None:
        self._bootstrap = bootstrap
        self._ssl = ssl_context
        self._ttl_s = ttl_s
        self._timeout = timeout_s
        self._max_topics = MAX_TOPICS if max_topics is None else max_topics
        self._entries: OrderedDict[str, tuple[TopicConfig | None, float, bool]] = OrderedDict()
        """topic -> (what is known, when it expires, whether that follows `ttl_s`)."""
        self._inflight: dict[str, asyncio.Future[None]] = {}

    @property
    def ttl_s(self) -> float:
        """How long an answer is trusted (`topic_configs.ttl_ms`)."""
        return self._ttl_s

    @ttl_s.setter
    def ttl_s(self, ttl_s: float) -> None:
        """A reload's new TTL: answers already kept expire as if learned under it (those kept
        for a time of their own, as a failure's `UNKNOWN_TTL_S`, keep it)."""
        shift = ttl_s - self._ttl_s
        self._ttl_s = ttl_s
        if shift:
            for topic, (config, expires, follows) in self._entries.items():
                if follows:
                    self._entries[topic] = (config, expires + shift, follows)

    def known(self, topic: str) -> bool:
        """Whether nothing needs asking: a fresh answer is kept, or `topic` cannot be a topic."""
        if not is_legal_topic_name(topic):
            return True
        entry = self._entries.get(topic)
        return entry is not None and entry[1] > time.monotonic()

    def compacted(self, topic: str) -> bool | None:
        """The cached compaction (None when unknown or expired)."""
        return self.config(topic).compacted

    def config(self, topic: str) -> TopicConfig:
        """The cached settings (`UNKNOWN_TOPIC_CONFIG` when unknown or expired)."""
        entry = self._entries.get(topic)
        if entry is None or entry[1] <= time.monotonic() or entry[0] is None:
            return UNKNOWN_TOPIC_CONFIG
        self._entries.move_to_end(topic)
        return entry[0]

    def put(
        self, topic: str, config: TopicConfig | bool | None, ttl_s: float | None = None
    ) -> None:
        """Keep what is known of `topic` (a bool: its compaction alone; None: unknown)."""
        if not is_legal_topic_name(topic):
            return
        if isinstance(config, bool):
            config = TopicConfig(compacted=config)
        ttl = self._ttl_s if ttl_s is None else ttl_s
        self._entries[topic] = (config, time.monotonic() + ttl, ttl_s is None)
        self._entries.move_to_end(topic)
        while len(self._entries) > self._max_topics:
            self._entries.popitem(last=False)

    async def refresh(self, topics: list[str]) -> None:
        """Ask the cluster about `topics` (one request; concurrent askers share it)."""
        waiting = [self._inflight[t] for t in topics if t in self._inflight]
        missing = [t for t in topics if t not in self._inflight]
        if missing:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            for topic in missing:
                self._inflight[topic] = future
            try:
                await self._describe(missing)
            finally:
                for topic in missing:
                    self._inflight.pop(topic, None)
                if not future.done():
                    future.set_result(None)
        for pending in waiting:
            # shielded: one waiting client going away must not cancel the lookup for the others
            await asyncio.shield(pending)

    async def _describe(self, topics: list[str]) -> None:
        for host, port in self._bootstrap():
            try:
                described = await describe_topic_configs(
                    host, port, self._ssl, self._timeout, topics
                )
            except (OSError, TimeoutError, ProtocolError) as exc:
                log.warning("DescribeConfigs to %s:%s failed: %s", host, port, exc)
                continue
            for topic, settings in described.items():
                if settings is None:
                    self.put(topic, None, UNKNOWN_TTL_S)
                else:
                    self.put(topic, from_cluster(settings).config)
            return
        for topic in topics:
            self.put(topic, None, UNKNOWN_TTL_S)
