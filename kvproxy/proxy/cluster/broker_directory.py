"""Where each broker lives and what clients are told for it: the node directory.

The answers rewritten for clients (`kvproxy.proxy.relay.connection_state.NodeDirectory`) name a
broker,
for a connection that came through a port-per-broker listener, by the proxy's public host and
the port of that broker's listener: the directory claims that port for the node for the life of
the process and opens its listener the first time a node is learnt. For a connection that came
through the SNI listener, every broker is named by its server name on the SNI listener's port.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from kvproxy.proxy.cluster.rewrite import AddressFor, proxy_addresses, sni_addresses
from kvproxy.proxy.config.listen_config import ListenConfig, NodePortError, shared_port_problem
from kvproxy.proxy.errors import ProxyError
from kvproxy.proxy.ops.metrics import ProxyMetrics


class NodeListeners(Protocol):
    """The listeners the directory opens a port on for a node it learns (`listen.Listeners`):
    the cluster room is handed this, never the listening room itself."""

    @property
    def sni_port(self) -> int: ...

    def is_open(self, node_id: int) -> bool: ...

    async def open(self, node_id: int | None, port: Callable[[], int]) -> None: ...


log = logging.getLogger("kvproxy")

_MAX_UNMAPPED_LOGGED = 1_000
"""Node ids remembered (and logged) as having no port or no listener; beyond, silence."""


class BrokerDirectory:
    """The brokers the cluster has named, their addresses and their proxy ports."""

    def __init__(
        self,
        listen: ListenConfig,
        bootstrap: tuple[tuple[str, int], ...],
        listeners: NodeListeners,
        metrics: ProxyMetrics,
    ) -> None:
        self._listen = listen
        """Read at start only: a reload does not move the ports."""
        self._bootstrap = bootstrap
        self._listeners = listeners
        self._metrics = metrics
        self._addresses: dict[int, tuple[str, int]] = {}
        self._port_owners: dict[int, int] = {}
        """port -> the node id that claimed it first: the mapping never changes while running."""
        self._unmapped: set[int] = set()
        """Node ids the cluster named that have no port (each logged once)."""
        self._listener_failures: set[int] = set()
        """Node ids whose listener could not open (each logged once)."""
        self._port_addresses = proxy_addresses(listen.public_host, self.port_or_none)
        sni = listen.sni
        self._sni_addresses = (
            None
            if sni is None
            else sni_addresses(sni.names.name_of, lambda: sni.advertised_port or listeners.sni_port)
        )

    def addresses_for(self, listener: str) -> AddressFor:
        """What answers to a connection of `listener` ("bootstrap", "broker", "sni") name each
        node: its server name on the SNI port, or the proxy's host and the node's own port."""
        if listener == "sni" and self._sni_addresses is not None:
            return self._sni_addresses
        return self._port_addresses

    @property
    def public_host(self) -> str:
        return self._listen.public_host

    @property
    def bootstrap_servers(self) -> tuple[tuple[str, int], ...]:
        return self._bootstrap

    def address_of(self, node_id: int) -> tuple[str, int] | None:
        """Where node `node_id` lives, None when no Metadata answer has named it yet."""
        return self._addresses.get(node_id)

    def port_for(self, node_id: int) -> int:
        """The listener port of node `node_id`, claimed for it for the life of this process;
        ProxyError when the mapping gives it none or another node holds that port."""
        try:
            port = self._listen.broker_port(node_id)
        except NodePortError as exc:
            raise ProxyError(str(exc)) from None
        owner = self._port_owners.setdefault(port, node_id)
        if owner != node_id:
            raise ProxyError(shared_port_problem(owner, node_id, port, self._listen.max_brokers))
        return port

    def port_or_none(self, node_id: int) -> int | None:
        """As `port_for`, but None (logged once per node) for a node with no port: answers to
        clients leave such a node out rather than fail, so the other brokers stay usable.
        No exception is made for a node past the first `_MAX_UNMAPPED_LOGGED` (an answer
        naming thousands of nodes with no port costs a lookup each). Called on the event loop
        and on the decoding thread (`rewrite_off_loop`): it only reads and claims ports."""
        port = self._listen.port_or_none(node_id)
        if port is not None and self._port_owners.setdefault(port, node_id) == node_id:
            return port
        if node_id not in self._unmapped and len(self._unmapped) < _MAX_UNMAPPED_LOGGED:
            try:
                self.port_for(node_id)
            except ProxyError as exc:
                self._unmapped.add(node_id)
                log.error("%s; answers to clients leave node %d out", exc, node_id)
                self._metrics.unmapped_nodes.set(len(self._unmapped))
        return None

    def knows_nodes(self, nodes: dict[int, tuple[str, int]]) -> bool:
        """True when every node is known at that address and has its listener open (or has
        none to open: no port-per-broker listeners, or a node with no port)."""
        per_broker = self._listen.port_per_broker
        return all(
            self._addresses.get(node_id) == address
            and (not per_broker or self._listeners.is_open(node_id) or node_id in self._unmapped)
            for node_id, address in nodes.items()
        )

    async def learn_node(self, node_id: int, address: tuple[str, int]) -> None:
        """Remember where node `node_id` lives and make sure its listener is open (port per
        broker; ProxyError when it has no port)."""
        self._addresses[node_id] = address
        if self._listen.port_per_broker:
            await self._listeners.open(node_id, lambda: self.port_for(node_id))

    async def learn_node_or_log(self, node_id: int, address: tuple[str, int]) -> None:
        """As `learn_node`, for a node the cluster names after start: a node with no port is
        logged once and gets no listener (the SNI listener, when there is one, still serves it),
        and a listener that cannot open (its port taken by another process) is logged once, and
        the answer still goes out, so one broker's port never fails every client's Metadata
        request."""
        if self._listen.port_per_broker and self.port_or_none(node_id) is None:
            if self._listen.sni is not None:
                self._addresses[node_id] = address
            return
        try:
            await self.learn_node(node_id, address)
        except (OSError, ProxyError) as exc:
            if node_id not in self._listener_failures:
                if len(self._listener_failures) < _MAX_UNMAPPED_LOGGED:
                    self._listener_failures.add(node_id)
                log.error("cannot open the listener for node %d: %s", node_id, exc)
