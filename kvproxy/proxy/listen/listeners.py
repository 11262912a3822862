"""The listening side: the ports clients connect to, and the parts that serve what they accept.

Port-per-broker: the bootstrap listener (`listen.port`) forwards to any live bootstrap server; the
listener for upstream node N is `listen.broker_port_base + N mod listen.max_brokers` (or
`+ N - listen.lowest_node_id` when that is set), opened the first time an answer names node N.

SNI (`listen.sni`): one TLS port for the bootstrap and every broker, the node chosen by the
server name the client sends (`kvproxy.proxy.listen.sni_route`); both kinds can listen at once.

`Listeners` opens and closes the listening sockets and puts together, each in a module of its
own, what a `ClientConnection` is handed (`kvproxy.proxy.relay.connection_state`) and what the
server runs:
`brokers` (the node directory), `connections` (the connection limits and the upstream connects),
`readiness` (what the cluster said, /readyz) and `metadata` (the proxy's own Metadata request).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvproxy.client.async_connections import AdminConnections
from kvproxy.journal import Journal
from kvproxy.proxy.cluster.broker_directory import BrokerDirectory
from kvproxy.proxy.cluster.metadata_refresh import MetadataRefresh
from kvproxy.proxy.cluster.readiness import ClusterReadiness
from kvproxy.proxy.config.proxy_config import ProxyConfig
from kvproxy.proxy.listen.client_connections import ClientConnections
from kvproxy.proxy.listen.sni_route import SniRoute
from kvproxy.proxy.listen.timeout_sweep import sweep_timeouts
from kvproxy.proxy.listen.tls_accept import HandshakeFailures, serve_tls
from kvproxy.proxy.listen.tls_admission import HandshakeGate
from kvproxy.proxy.listen.tls_context import ListenerContext, listener_context
from kvproxy.proxy.ops.fds import FdExhaustion
from kvproxy.proxy.ops.metrics import ProxyMetrics
from kvproxy.proxy.relay.upstream_dialer import UpstreamDialer

if TYPE_CHECKING:
    from kvproxy.proxy.relay.client_connection import ClientConnection

log = logging.getLogger("kvproxy")


class Listeners:
    """Opens a listener per node once and closes them all when the proxy stops; holds the parts
    serving the connections they accept."""

    def __init__(
        self,
        config: ProxyConfig,
        bootstrap: tuple[tuple[str, int], ...],
        metrics: ProxyMetrics,
        journal: Journal | None,
        new_connection: Callable[[int | None], ClientConnection],
        *,
        client_ssl: ListenerContext | None,
        upstream_ssl: ssl.SSLContext | None,
        reuse_port: bool,
        admin_connections: AdminConnections | None = None,
    ) -> None:
        self._config = config
        """Read for `listen`, `upstream` and `limits`, which only take effect at start."""
        self._new_connection = new_connection
        self._client_ssl = client_ssl
        self._reuse_port = reuse_port
        self._servers: dict[int | None, asyncio.Server] = {}
        """Node id (None: the bootstrap listener) -> its listener."""
        self._lock = asyncio.Lock()
        self._closing = False
        self.fds = FdExhaustion()
        """Running out of file descriptors, logged as such (not as an unreachable upstream)."""
        self.handshake_failures = HandshakeFailures(metrics)
        """Failed TLS handshakes of every TLS listener, logged and counted."""
        timeout = config.upstream.connect_timeout_ms / 1000
        self.brokers = BrokerDirectory(config.listen, bootstrap, self, metrics)
        self.readiness = ClusterReadiness(bootstrap, timeout, metrics, self.fds, journal)
        self.metadata = MetadataRefresh(
            self.brokers,
            self.readiness,
            upstream_ssl=upstream_ssl,
            connect_timeout_s=timeout,
            admin_connections=admin_connections,
        )
        upstreams = UpstreamDialer(
            self.brokers,
            self.metadata,
            metrics,
            self.fds,
            limits=config.limits,
            upstream_ssl=upstream_ssl,
            connect_timeout_s=timeout,
        )
        self.connections = ClientConnections(config.limits, metrics, upstreams)
        self.handshakes = HandshakeGate(config.limits, self.connections)
        """TLS handshakes in progress, admitted against the limits from accept."""
        sni = config.listen.sni
        self._sni_route = (
            None if sni is None else SniRoute(sni, self.brokers, self.metadata.refresh)
        )
        self._sni_server: asyncio.Server | None = None

    async def open_bootstrap(self) -> None:
        """Open the bootstrap listener and the SNI listener, then a listener for every broker
        the cluster names now."""
        if self._config.listen.port_per_broker:
            await self.open(None, lambda: self._config.listen.port)
        await self.open_sni()
        await self.metadata.refresh(strict=True)

    async def open_sni(self) -> None:
        """Open the SNI listener (`listen.sni`), if there is one."""
        listen = self._config.listen
        sni, tls = listen.sni, listen.sni_tls
        if sni is None or tls is None or self._sni_route is None:
            return
        self._sni_server = await serve_tls(
            asyncio.get_running_loop(),
            lambda _node, _acceptance: self._new_connection(None),  # routed in the handshake
            host=sni.host or listen.host,
            port=sni.port,
            context=listener_context(tls),
            listener="sni",
            node_id=None,
            route=self._sni_route,
            failures=self.handshake_failures,
            reuse_port=self._reuse_port,
            gate=self.handshakes,
        )
        bound = self._sni_server.sockets[0].getsockname()
        log.info(
            "listening for the bootstrap (%s) and every broker (%s) by server name on %s:%s",
            sni.bootstrap,
            sni.brokers,
            bound[0],
            bound[1],
        )

    @property
    def sni_port(self) -> int:
        """The SNI listener's port (the bound one when `listen.sni.port` is 0)."""
        if self._sni_server is None:
            raise RuntimeError("the SNI listener is not open")
        return int(self._sni_server.sockets[0].getsockname()[1])

    def describe(self) -> str:
        """Where clients connect, for the log line at start."""
        listen = self._config.listen
        where = []
        if listen.port_per_broker:
            where.append(
                f"bootstrap {listen.public_host}:{self.bootstrap_port}, {listen.port_rule}"
            )
        if listen.sni is not None and self._sni_server is not None:
            port = listen.sni.advertised_port or self.sni_port
            where.append(f"SNI {listen.sni.bootstrap}:{port} (brokers {listen.sni.brokers}:{port})")
        return "; ".join(where)

    async def open(self, node_id: int | None, port: Callable[[], int]) -> None:
        """Open the listener of `node_id` unless it is open (or the proxy is stopping).

        `port` is asked only when the listener is not open yet: claiming a node's port can fail
        (ProxyError), a listener already open never does."""
        if node_id in self._servers or self._closing:
            return
        async with self._lock:
            if node_id in self._servers:
                return
            server = await self._serve(node_id, port())
            self._servers[node_id] = server
            bound = server.sockets[0].getsockname()
            what = "bootstrap" if node_id is None else f"node {node_id}"
            log.info("listening for %s on %s:%s", what, bound[0], bound[1])

    async def _serve(self, node_id: int | None, port: int) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        host = self._config.listen.host
        if self._client_ssl is None:
            return await loop.create_server(
                functools.partial(self._new_connection, node_id),
                host=host,
                port=port,
                reuse_address=True,
                reuse_port=self._reuse_port,
            )
        return await serve_tls(
            loop,
            lambda node, _acceptance: self._new_connection(node),
            host=host,
            port=port,
            context=self._client_ssl,
            listener="bootstrap" if node_id is None else "broker",
            node_id=node_id,
            route=None,
            failures=self.handshake_failures,
            reuse_port=self._reuse_port,
            gate=self.handshakes,
        )

    def is_open(self, node_id: int) -> bool:
        return node_id in self._servers

    @property
    def bootstrap_port(self) -> int:
        return int(self._servers[None].sockets[0].getsockname()[1])

    @property
    def count(self) -> int:
        """Listeners open."""
        return len(self._servers) + (self._sni_server is not None)

    async def sweep(self) -> None:
        """Close idle and stalled client connections (`kvproxy.proxy.listen.timeout_sweep`)."""
        await sweep_timeouts(self._config.limits, self.connections)

    async def watch_readiness(self) -> None:
        """Keep `kvproxy_ready` current; ask the cluster again until it has answered."""
        await self.readiness.watch(self.metadata.refresh)

    async def drain(self, drain_timeout: float) -> None:
        """Stop accepting, let in-flight requests finish (bounded), then close every client."""
        self._closing = True
        servers = [*self._servers.values(), *filter(None, [self._sni_server])]
        for server in servers:
            server.close()
        if self._sni_route is not None:
            self._sni_route.stop()
        await self.connections.drain(drain_timeout)
        self.handshake_failures.close()
        for server in servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
