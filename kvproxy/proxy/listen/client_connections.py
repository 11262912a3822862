"""The client connections open now, counted against the connection limits.

The `kvproxy.proxy.relay.connection_state.ConnectionRegistry` a `ClientConnection` is handed: it
counts each
connection in and out (refusing those over `limits.max_connections_per_listener` or
`limits.max_connections_per_client`, and logging the refusals at most once an interval), and
opens each one's upstream side (`kvproxy.proxy.relay.upstream_dialer`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Any

from kvproxy.proxy.config.proxy_config import LimitsConfig
from kvproxy.proxy.listen.tls_accept import handshake_done
from kvproxy.proxy.ops.metrics import MAX_NODE_LABELS, ProxyMetrics
from kvproxy.proxy.relay.close_reasons import CloseReason
from kvproxy.proxy.relay.connection_state import REFUSAL_LOG_INTERVAL_S, listener_words
from kvproxy.proxy.relay.upstream_dialer import UpstreamDialer

if TYPE_CHECKING:
    from kvproxy.proxy.relay.client_connection import ClientConnection
    from kvproxy.proxy.relay.upstream_connection import UpstreamConnection

log = logging.getLogger("kvproxy")


class ClientConnections:
    """Every open client connection, per listener and per client address."""

    def __init__(self, limits: LimitsConfig, metrics: ProxyMetrics, upstreams: UpstreamDialer):
        self._limits = limits
        """Read at start only: a reload does not change the connection limits."""
        self._metrics = metrics
        self.upstreams = upstreams
        self._clients: set[ClientConnection] = set()
        self._per_listener: collections.Counter[tuple[str, int | None]] = collections.Counter()
        """(listener, node) -> open connections: each port-per-broker port, and each node (and
        the bootstrap) of the SNI listener, counts against `max_connections_per_listener`."""
        self._node_labels: set[int] = set()
        """Node ids `kvproxy_client_connections_accepted_total` labels by (bounded)."""
        self._per_client: collections.Counter[str] = collections.Counter()
        self._refused = 0
        """Connections refused since the last log line about them."""
        self._refused_logged_at = float("-inf")

    @property
    def count(self) -> int:
        return len(self._clients)

    def open_now(self) -> list[ClientConnection]:
        """The connections open at this moment (a copy: closing one changes the set)."""
        return list(self._clients)

    def connection_opened(self, client: ClientConnection) -> bool:
        """Count a new client connection; False (and counted as refused) when it would pass
        `limits.max_connections_per_listener` or `limits.max_connections_per_client`."""
        limits = self._limits
        listener, host = (client.listener, client.node_id), client.client_host
        handshake_done(client.transport)  # no longer counted as a handshake in progress
        self._count_accepted(client)
        if (
            self._per_listener[listener] >= limits.max_connections_per_listener
            or self._per_client[host] >= limits.max_connections_per_client
        ):
            self._metrics.closed.labels(CloseReason.TOO_MANY_CONNECTIONS).inc()
            self._refused += 1
            self.log_refusals(asyncio.get_running_loop().time(), client)
            return False
        self._per_listener[listener] += 1
        self._per_client[host] += 1
        self._clients.add(client)
        self._metrics.client_connections.inc()
        return True

    def open_from(self, host: str) -> int:
        """Open connections from the address `host`, over all listeners."""
        return self._per_client[host]

    def open_on(self, listener: tuple[str, int | None]) -> int:
        """Open connections of (listener, node)."""
        return self._per_listener[listener]

    def refuse(self, reason: CloseReason) -> None:
        """A connection refused when accepted, before its TLS handshake (`tls_admission`):
        counted under `reason` and logged with the other refusals."""
        self._metrics.closed.labels(reason).inc()
        self._refused += 1
        self.log_refusals(asyncio.get_running_loop().time())

    def _count_accepted(self, client: ClientConnection) -> None:
        node_id = client.node_id
        if node_id is None:
            node = "bootstrap"
        elif node_id in self._node_labels or len(self._node_labels) < MAX_NODE_LABELS:
            self._node_labels.add(node_id)
            node = str(node_id)
        else:
            node = "other"
        self._metrics.client_connections_accepted.labels(client.listener, node).inc()

    def log_refusals(self, now: float, client: ClientConnection | None = None) -> None:
        """One line per `REFUSAL_LOG_INTERVAL_S` at most, however many connections a flood
        brings: the first refusal of a quiet period at once, the rest summed up later (the
        timeout sweep calls this every tick)."""
        if not self._refused or now - self._refused_logged_at < REFUSAL_LOG_INTERVAL_S:
            return
        limits = self._limits
        if client is not None and self._refused == 1:
            log.warning(
                "refusing a connection from %s on %s: %d open from that address "
                "(limit %d), %d on the listener (limit %d)",
                client.peer,
                listener_words(client),
                self._per_client[client.client_host],
                limits.max_connections_per_client,
                self._per_listener[client.listener, client.node_id],
                limits.max_connections_per_listener,
            )
        else:
            log.warning(
                "refused %d connections over the connection limits in the last %.0f s "
                "(max_connections_per_client %d, max_connections_per_listener %d)",
                self._refused,
                min(now - self._refused_logged_at, 1e9),
                limits.max_connections_per_client,
                limits.max_connections_per_listener,
            )
        self._refused = 0
        self._refused_logged_at = now

    def connection_closed(self, client: ClientConnection) -> None:
        """Forget a closed client connection (it no longer counts against the limits)."""
        if client in self._clients:
            self._clients.discard(client)
            self._metrics.client_connections.dec()
            self._forget(self._per_listener, (client.listener, client.node_id))
            self._forget(self._per_client, client.client_host)

    @staticmethod
    def _forget(counts: collections.Counter[Any], key: Any) -> None:
        if counts[key] <= 1:
            del counts[key]  # a client address that has gone leaves nothing behind
        else:
            counts[key] -= 1

    async def open_upstream(
        self, client: ClientConnection, node_id: int | None
    ) -> UpstreamConnection:
        return await self.upstreams.open(client, node_id)

    def upstream_closed(self) -> None:
        self.upstreams.closed()

    async def drain(self, drain_timeout: float) -> None:
        """Let in-flight requests finish (bounded), then close every client connection."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_timeout
        while any(client.in_flight for client in self._clients) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for client in list(self._clients):
            client.close()
