"""Topic ids and the names they stand for, for Produce v13 (topics by id).

A client sends Produce v13 only for topics whose id it learned from a Metadata answer, and every
Metadata answer a client gets passes through the proxy: the ids are learned there (`learn`),
before the first Produce that names them. An id the proxy has not seen (a client that learned it
elsewhere, a proxy restarted under a running client) is asked of the cluster with Metadata v12
by topic id, within the bounds of every lookup the clients cause (`topic_configs`: names a
connection may have asked about a second, names a request, requests a second, names pending);
an id that is still unknown is answered UNKNOWN_TOPIC_ID, as Kafka answers an id it does not
know, and the client refreshes its metadata and retries.

The map is bounded (`MAX_TOPIC_IDS`, the least recently used dropped first), and so is what is
remembered of ids the cluster does not know.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final

from kvproxy.client.async_connections import AdminConnections
from kvproxy.client.async_requests import topic_names_of
from kvproxy.protocol.errors import ProtocolError
from kvproxy.proxy.config.proxy_config import TopicConfigsConfig
from kvproxy.proxy.lookups.budget import ClientLookupBudget, RequestPacer
from kvproxy.proxy.ops.log_limits import LineLimit

log = logging.getLogger("kvproxy")
_failed = LineLimit("Metadata by topic id failed", log)

MAX_TOPIC_IDS: Final = 100_000
"""Ids kept (an id and a name of at most 249 characters: a few tens of MB at the most)."""


class TopicIds:
    """Topic id -> name, learned from Metadata answers and asked of the cluster when missing."""

    def __init__(
        self,
        bootstrap: Callable[[], Iterable[tuple[str, int]]],
        ssl_context: ssl.SSLContext | None,
        timeout_s: float,
        settings: TopicConfigsConfig,
        *,
        connections: AdminConnections | None = None,
        max_ids: int = MAX_TOPIC_IDS,
    ) -> None:
        self._bootstrap = bootstrap
        self._ssl = ssl_context
        self._timeout = timeout_s
        self._connections = connections
        self._max_ids = max_ids
        self._names: OrderedDict[uuid.UUID, str] = OrderedDict()
        self._absent: OrderedDict[uuid.UUID, float] = OrderedDict()
        """id -> until when "the cluster does not know it" holds."""
        self.settings = settings
        self._clients = ClientLookupBudget(
            settings.lookups_per_client_per_second,
            max(settings.lookups_per_client_per_second, settings.max_topics_per_request),
        )
        self._pacer = RequestPacer(settings.lookup_requests_per_second)
        self._lock = asyncio.Lock()
        self.asked = 0
        """Metadata requests sent to learn ids (for the tests and the log)."""

    def learn(self, pairs: Iterable[tuple[uuid.UUID, str]]) -> None:
        """Keep the (id, name) pairs an answer gave."""
        names = self._names
        for topic_id, name in pairs:
            names[topic_id] = name
            names.move_to_end(topic_id)
            self._absent.pop(topic_id, None)
        while len(names) > self._max_ids:
            names.popitem(last=False)

    def name_of(self, topic_id: uuid.UUID) -> str | None:
        name = self._names.get(topic_id)
        if name is not None:
            self._names.move_to_end(topic_id)
        return name

    def missing(self, ids: Iterable[uuid.UUID]) -> list[uuid.UUID]:
        """Of `ids`, those neither known nor recently found absent."""
        now = time.monotonic()
        return [i for i in ids if i not in self._names and self._absent.get(i, now) <= now]

    def admit(self, ids: list[uuid.UUID], client: object | None) -> list[uuid.UUID]:
        """Of the missing `ids`, those `client` may have asked about now (its lookup budget and
        the pending bound); the others are answered UNKNOWN_TOPIC_ID, which clients retry."""
        granted = len(ids) if client is None else self._clients.grant(client, len(ids))
        return ids[: min(granted, self.settings.max_pending_topics)]

    async def resolve(self, ids: list[uuid.UUID]) -> None:
        """Ask the cluster for the names of `ids` (`max_topics_per_request` ids a request,
        paced); an id it does not name is remembered as absent for `absent_ttl_ms`."""
        async with self._lock:  # one request at a time; ids learned meanwhile are not asked
            wanted = self.missing(ids)
            step = self.settings.max_topics_per_request
            for start in range(0, len(wanted), step):
                await self._pacer.wait()
                await self._ask(wanted[start : start + step])

    async def _ask(self, ids: list[uuid.UUID]) -> None:
        self.asked += 1
        for host, port in self._bootstrap():
            try:
                found = await topic_names_of(
                    host, port, self._ssl, self._timeout, ids, connections=self._connections
                )
            except (OSError, TimeoutError, ProtocolError) as exc:
                _failed.log(
                    logging.WARNING, "Metadata by topic id to %s:%s failed: %s", host, port, exc
                )
                continue
            self.learn(found.items())
            until = time.monotonic() + self.settings.absent_ttl_ms / 1000
            for topic_id in ids:
                if topic_id not in found:
                    self._absent[topic_id] = until
                    self._absent.move_to_end(topic_id)
            while len(self._absent) > self.settings.max_absent_topics:
                self._absent.popitem(last=False)
            return
