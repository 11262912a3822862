"""Topic settings (compaction, timestamps, sizes) learned from the cluster with DescribeConfigs.

The broker's checks depend on a topic's settings (`kvproxy.policies.topic_settings`): whether it is
compacted, its timestamp type and bounds, its largest batch and segment. Operators should not
have to repeat in kvproxy what the cluster already says. Answers are cached for `ttl`; a topic
the cluster cannot describe (no such topic, or the request failed) is cached as unknown for
`absent_ttl_ms`, apart (at most `max_absent_topics`, so invented names never evict described
topics), and an unknown setting is left to the check's own default (an unknown compaction
passes `compacted_key`, as a broker would accept it into a new, delete-policy topic).

Clients choose the names, so asking is bounded too (`kvproxy.proxy.lookups.budget`): each connection
may have `max_topics_per_request` new names described at once, then `lookups_per_client_per_second`
a second; names asked together go in one request of up to `max_topics_per_request` names, at most
`lookup_requests_per_second` requests a second on one kept connection
(`kvproxy.client.async_connections`), and at most `max_pending_topics` names wait. A name beyond
these bounds is decided as after a failed DescribeConfigs: its settings unknown, the request
forwarded, and the broker answers it (Kafka: a Produce to no such topic gets
UNKNOWN_TOPIC_OR_PARTITION, and a compacted topic refuses records without a key).

The cache is bounded: at most `MAX_TOPICS` described names (the least recently used dropped
first), and a name that cannot be a topic (`kvproxy.protocol.topics`) is never asked about or kept:
it counts as not compacted, and the broker refuses it anyway.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final

from kvproxy.client.async_connections import AdminConnections
from kvproxy.client.async_requests import describe_topic_configs
from kvproxy.policies.api import UNKNOWN_TOPIC_CONFIG, TopicConfig
from kvproxy.policies.topic_settings import from_cluster
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.topics import is_legal_topic_name
from kvproxy.proxy.config.proxy_config import TopicConfigsConfig
from kvproxy.proxy.lookups.budget import ClientLookupBudget, RequestPacer
from kvproxy.proxy.ops.log_limits import LineLimit

log = logging.getLogger("kvproxy")
_failed = LineLimit("DescribeConfigs failed", log)

MAX_TOPICS: Final = 10_000
"""Topics whose answer is kept; with names of at most 249 characters, a few MB at most."""
SKIP_LOG_INTERVAL_S: Final = 10.0


class TopicConfigCache:
    def __init__(
        self,
        bootstrap: Callable[[], Iterable[tuple[str, int]]],
        ssl_context: ssl.SSLContext | None,
        ttl_s: float,
        timeout_s: float,
        max_topics: int | None = None,
        *,
        settings: TopicConfigsConfig | None = None,
        connections: AdminConnections | None = None,
        count: Callable[[str, int], None] | None = None,
    ) -> None:
        self._bootstrap = bootstrap
        self._ssl = ssl_context
        self._ttl_s = ttl_s
        self._timeout = timeout_s
        self._max_topics = MAX_TOPICS if max_topics is None else max_topics
        self._connections = connections
        self._count = count
        """outcome ("asked", "client_rate", "pending"), names -> the metric."""
        self._entries: OrderedDict[str, tuple[TopicConfig, float, bool]] = OrderedDict()
        """topic -> (what is known, when it expires, whether that follows `ttl_s`)."""
        self._unknown: OrderedDict[str, float] = OrderedDict()
        """name -> until when "the cluster cannot describe it" holds."""
        self._settings = TopicConfigsConfig() if settings is None else settings
        self._clients = ClientLookupBudget(
            self._settings.lookups_per_client_per_second, self._burst(self._settings)
        )
        self._pacer = RequestPacer(self._settings.lookup_requests_per_second)
        self.label_pacer = RequestPacer(self._settings.lookup_requests_per_second)
        """Paces the Metadata requests asking which names exist (`kvproxy.proxy.ops.topic_labels`):
        names counted meanwhile wait for the next one."""
        self._queued: dict[str, asyncio.Future[None]] = {}
        self._asking: dict[str, asyncio.Future[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._skipped = 0
        self._skip_logged_at = float("-inf")

    @property
    def settings(self) -> TopicConfigsConfig:
        return self._settings

    @settings.setter
    def settings(self, settings: TopicConfigsConfig) -> None:
        """A reload's `topic_configs` section (`ttl_ms` applies as the `ttl_s` setter says)."""
        self._settings = settings
        self._clients.per_second = settings.lookups_per_client_per_second
        self._clients.burst = self._burst(settings)
        self._pacer.per_second = settings.lookup_requests_per_second
        self.label_pacer.per_second = settings.lookup_requests_per_second
        self.ttl_s = settings.ttl_ms / 1000

    @staticmethod
    def _burst(settings: TopicConfigsConfig) -> int:
        """New names one connection may have described at once: one full request's worth."""
        return max(settings.lookups_per_client_per_second, settings.max_topics_per_request)

    @property
    def ttl_s(self) -> float:
        """How long an answer is trusted (`topic_configs.ttl_ms`)."""
        return self._ttl_s

    @ttl_s.setter
    def ttl_s(self, ttl_s: float) -> None:
        """A reload's new TTL: answers already kept expire as if learned under it (those kept
        for a time of their own, as a failure's, keep it)."""
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
        now = time.monotonic()
        entry = self._entries.get(topic)
        if entry is not None and entry[1] > now:
            return True
        return self._unknown.get(topic, now) > now

    def compacted(self, topic: str) -> bool | None:
        """The cached compaction (None when unknown or expired)."""
        return self.config(topic).compacted

    def config(self, topic: str) -> TopicConfig:
        """The cached settings (`UNKNOWN_TOPIC_CONFIG` when unknown or expired)."""
        entry = self._entries.get(topic)
        if entry is None or entry[1] <= time.monotonic():
            return UNKNOWN_TOPIC_CONFIG
        self._entries.move_to_end(topic)
        return entry[0]

    def put(
        self, topic: str, config: TopicConfig | bool | None, ttl_s: float | None = None
    ) -> None:
        """Keep what is known of `topic` (a bool: its compaction alone; None: unknown, for
        `ttl_s` or `absent_ttl_ms`)."""
        if not is_legal_topic_name(topic):
            return
        if config is None:
            self._entries.pop(topic, None)
            ttl = self._settings.absent_ttl_ms / 1000 if ttl_s is None else ttl_s
            self._unknown[topic] = time.monotonic() + ttl
            self._unknown.move_to_end(topic)
            while len(self._unknown) > self._settings.max_absent_topics:
                self._unknown.popitem(last=False)
            return
        if isinstance(config, bool):
            config = TopicConfig(compacted=config)
        self._unknown.pop(topic, None)
        ttl = self._ttl_s if ttl_s is None else ttl_s
        self._entries[topic] = (config, time.monotonic() + ttl, ttl_s is None)
        self._entries.move_to_end(topic)
        while len(self._entries) > self._max_topics:
            self._entries.popitem(last=False)

    def admit(self, topics: list[str], client: object | None) -> list[str]:
        """Of `topics` (not known), those to describe: names already being asked about, then
        new names within `client`'s rate and the pending bound. The others are decided with
        their settings unknown (counted, and logged once per `SKIP_LOG_INTERVAL_S`)."""
        topics = list(dict.fromkeys(topics))
        pending = [t for t in topics if t in self._queued or t in self._asking]
        new = [t for t in topics if t not in self._queued and t not in self._asking]
        if not new:
            return pending
        granted = len(new) if client is None else self._clients.grant(client, len(new))
        room = self._settings.max_pending_topics - len(self._queued) - len(self._asking)
        admitted = new[: max(0, min(granted, room))]
        if admitted and self._count is not None:
            self._count("asked", len(admitted))
        if len(admitted) < len(new):
            outcome = "client_rate" if granted <= room else "pending"
            self._skip(outcome, len(new) - len(admitted))
        return pending + admitted

    def _skip(self, outcome: str, names: int) -> None:
        if self._count is not None:
            self._count(outcome, names)
        self._skipped += names
        now = time.monotonic()
        if now - self._skip_logged_at >= SKIP_LOG_INTERVAL_S:
            self._skip_logged_at = now
            log.warning(
                "%d new topic name(s) decided with their settings unknown, not asked of the "
                "cluster: over topic_configs.lookups_per_client_per_second (%d) or "
                "max_pending_topics (%d)",
                self._skipped,
                self._settings.lookups_per_client_per_second,
                self._settings.max_pending_topics,
            )
            self._skipped = 0

    async def refresh(self, topics: list[str]) -> None:
        """Ask the cluster about `topics`: they join the next request (shared with every other
        asker, `max_topics_per_request` names a request); returns once each is answered."""
        loop = asyncio.get_running_loop()
        waiting = []
        for topic in topics:
            future = self._asking.get(topic) or self._queued.get(topic)
            if future is None:
                future = self._queued[topic] = loop.create_future()
            waiting.append(future)
        if self._queued and self._task is None:
            self._task = loop.create_task(self._ask_all(), name="kvproxy-topic-configs")
        for future in waiting:
            # shielded: one waiting client going away must not cancel the lookup for the others
            await asyncio.shield(future)

    async def _ask_all(self) -> None:
        """Describe the queued names, `max_topics_per_request` a request, paced."""
        try:
            while self._queued:
                await self._pacer.wait()
                names = list(self._queued)[: self._settings.max_topics_per_request]
                self._asking = {name: self._queued.pop(name) for name in names}
                try:
                    await self._describe(names)
                finally:
                    asked, self._asking = self._asking, {}
                    for future in asked.values():
                        if not future.done():
                            future.set_result(None)
        finally:
            self._task = None

    def close(self) -> None:
        """Stop asking; whoever waits is answered (the names stay unknown)."""
        if self._task is not None:
            self._task.cancel()
        for future in [*self._queued.values(), *self._asking.values()]:
            if not future.done():
                future.set_result(None)
        self._queued.clear()

    async def _describe(self, topics: list[str]) -> None:
        for host, port in self._bootstrap():
            try:
                if self._connections is None:
                    described = await describe_topic_configs(
                        host, port, self._ssl, self._timeout, topics
                    )
                else:
                    described = await describe_topic_configs(
                        host, port, self._ssl, self._timeout, topics, connections=self._connections
                    )
            except (OSError, TimeoutError, ProtocolError) as exc:
                _failed.log(logging.WARNING, "DescribeConfigs to %s:%s failed: %s", host, port, exc)
                continue
            for topic in topics:
                settings = described.get(topic)
                if settings is None:
                    self.put(topic, None)
                else:
                    self.put(topic, from_cluster(settings).config)
            return
        for topic in topics:
            self.put(topic, None)
