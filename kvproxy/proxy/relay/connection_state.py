"""What a client connection is handed: the few shared parts of the relay it works with.

As uvicorn's `ServerState`: a connection gets its limits, the metrics, the receive-memory
waiters, the produce decisions, the rejection sink, the node directory and the connection
registry, and nothing else of the server. The directory and the registry are described here as
protocols (the listeners implement them), so `kvproxy.proxy.relay.client_connection` never imports
the modules
that create connections.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kvproxy.protocol.framing import BufferPool
from kvproxy.proxy.cluster.rewrite import AddressFor
from kvproxy.proxy.config.proxy_config import LimitsConfig
from kvproxy.proxy.ops.metrics import ProxyMetrics
from kvproxy.proxy.produce.decider import ProduceDecider
from kvproxy.proxy.refusals.sink import RejectionSink
from kvproxy.proxy.relay.receive_memory import ReceiveWaiters

if TYPE_CHECKING:
    from kvproxy.proxy.relay.client_connection import ClientConnection
    from kvproxy.proxy.relay.upstream_connection import UpstreamConnection


REFUSAL_LOG_INTERVAL_S = 10.0
"""Refused connections are logged at most once per interval, with a count of the rest."""

ResponseTap = Callable[[int, int, bytes], None]
"""Sees every answer as it leaves for a client: (api key, api version, frame). For tracing."""


def arrival(
    transport: asyncio.BaseTransport, listener: str, node_id: int | None
) -> tuple[str, int | None]:
    """The listener a connection came through and the node it serves: as its listener says, or
    on the SNI listener the node its server name chose during the handshake."""
    acceptance = getattr(transport.get_extra_info("ssl_object"), "acceptance", None)
    if acceptance is not None and acceptance.listener == "sni":
        return "sni", acceptance.node_id
    return listener, node_id


def listener_words(client: ClientConnection) -> str:
    """ "the SNI listener (node 3)", "the SNI listener (bootstrap)", "the node 3 listener"."""
    node = "bootstrap" if client.node_id is None else f"node {client.node_id}"
    return f"the SNI listener ({node})" if client.listener == "sni" else f"the {node} listener"


class NodeDirectory(Protocol):
    """Where the brokers are, as the answers rewritten for clients need it."""

    def addresses_for(self, listener: str) -> AddressFor: ...

    def knows_nodes(self, nodes: dict[int, tuple[str, int]]) -> bool: ...

    async def learn_node_or_log(self, node_id: int, address: tuple[str, int]) -> None: ...


class ConnectionRegistry(Protocol):
    """Counts connections against the limits and opens their upstream side."""

    def connection_opened(self, client: ClientConnection) -> bool: ...

    def connection_closed(self, client: ClientConnection) -> None: ...

    async def open_upstream(
        self, client: ClientConnection, node_id: int | None
    ) -> UpstreamConnection: ...

    def upstream_closed(self) -> None: ...


class TaskCount:
    """Tasks the connections have running (the server waits for them when it stops)."""

    def __init__(self) -> None:
        self.running = 0

    def started(self) -> None:
        self.running += 1

    def finished(self) -> None:
        self.running -= 1


@dataclass(frozen=True, slots=True)
class ConnectionState:
    """The shared parts of the relay a client connection uses (one per server)."""

    limits: LimitsConfig
    metrics: ProxyMetrics
    buffer_pool: BufferPool
    """Large-frame buffers shared by every connection of the server (one event loop)."""
    receive: ReceiveWaiters
    decisions: ProduceDecider
    sink: RejectionSink
    nodes: NodeDirectory
    connections: ConnectionRegistry
    tasks: TaskCount
    tap: ResponseTap | None
    unknown_apis: str = "remove"
    """`apis.unknown`: whether APIs newer than the proxy's table are offered."""
