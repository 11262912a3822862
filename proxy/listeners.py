"""The listening side: ports, connection limits, the node directory and cluster readiness.

Port-per-broker: the bootstrap listener (`listen.port`) forwards to any live bootstrap server; the
listener for upstream node N is `listen.broker_port_base + N mod listen.max_brokers` (or
`+ N - listen.lowest_node_id` when that is set), opened the first time an answer names node N.
`Listeners` is the node directory and the connection registry a `ClientConnection` is handed
(`kvproxy.proxy.relay_state`): it counts connections against the limits, closes idle ones, and opens
each one's upstream side.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvproxy.journal import Journal
from kvproxy.protocol.errors import ProtocolError
from kvproxy.proxy.admin_connections import AdminConnections
from kvproxy.proxy.config import NodePortError, ProxyConfig, shared_port_problem
from kvproxy.proxy.errors import ProxyError
from kvproxy.proxy.fds import FdExhaustion, OutOfFileDescriptors, out_of_fds
from kvproxy.proxy.fds import describe as describe_fd_shortage
from kvproxy.proxy.metrics import ProxyMetrics
from kvproxy.proxy.reasons import CloseReason
from kvproxy.proxy.relay_state import REFUSAL_LOG_INTERVAL_S
from kvproxy.proxy.upstream_client import describe_failure
from kvproxy.proxy.upstream_connection import UpstreamConnection

if TYPE_CHECKING:
    from kvproxy.proxy.connection import ClientConnection

log = logging.getLogger("kvproxy")

READINESS_INTERVAL_S = 5.0
METADATA_RETRY_S = 1.0
"""Until the cluster first answers Metadata, how often the proxy asks again."""
_SWEEP_MIN_S = 0.01
_SWEEP_MAX_S = 5.0
_MAX_UNMAPPED_LOGGED = 1_000
"""Node ids remembered (and logged) as having no port or no listener; beyond, silence."""


class Listeners:
    """Owns the listeners, the node directory and the count of client connections."""

    def __init__(
        self,
        config: ProxyConfig,
        bootstrap: tuple[tuple[str, int], ...],
        metrics: ProxyMetrics,
        journal: Journal | None,
        new_connection: Callable[[int | None], ClientConnection],
        *,
        client_ssl: ssl.SSLContext | None,
        upstream_ssl: ssl.SSLContext | None,
        reuse_port: bool,
        admin_connections: AdminConnections | None = None,
    ) -> None:
        self.config = config
        self._admin = admin_connections
        """Where the proxy's own Metadata requests go (one kept connection per address)."""
        """Read for `listen`, `upstream` and `limits`, which only take effect at start."""
        self._bootstrap = bootstrap
        self.metrics = metrics
        self.journal = journal
        self._new_connection = new_connection
        self._client_ssl = client_ssl
        self._upstream_ssl = upstream_ssl
        self._reuse_port = reuse_port
        self._nodes: dict[int, tuple[str, int]] = {}
        self._port_owners: dict[int, int] = {}
        """port -> the node id that claimed it first: the mapping never changes while running."""
        self._unmapped: set[int] = set()
        """Node ids the cluster named that have no port (each logged once)."""
        self._listener_failures: set[int] = set()
        """Node ids whose listener could not open (each logged once)."""
        self._listeners: dict[int | None, asyncio.Server] = {}
        self._listener_lock = asyncio.Lock()
        self._clients: set[ClientConnection] = set()
        self._per_listener: collections.Counter[int | None] = collections.Counter()
        self._per_client: collections.Counter[str] = collections.Counter()
        self._refused = 0
        """Connections refused since the last log line about them."""
        self._refused_logged_at = float("-inf")
        self.fds = FdExhaustion()
        """Running out of file descriptors, logged as such (not as an unreachable upstream)."""
        self._upstreams = 0
        self._stopping = False
        self._ready_cache: tuple[float, bool, str] = (0.0, False, "not checked yet")
        self._cluster_answer: str | None = None
        """What the first Metadata answer said; None until the cluster has answered."""
        self._cluster_problem: str | None = None

    async def open_bootstrap(self) -> None:
        """Open the bootstrap listener, then a listener for every broker the cluster names now."""
        await self._ensure_listener(None)
        await self.refresh_nodes(strict=True)

    # ---- addresses ----

    @property
    def public_host(self) -> str:
        return self.config.listen.public_host

    def port_for(self, node_id: int) -> int:
        """The listener port of node `node_id`, claimed for it for the life of this process;
        ProxyError when the mapping gives it none or another node holds that port."""
        listen = self.config.listen
        try:
            port = listen.broker_port(node_id)
        except NodePortError as exc:
            raise ProxyError(str(exc)) from None
        owner = self._port_owners.setdefault(port, node_id)
        if owner != node_id:
            raise ProxyError(shared_port_problem(owner, node_id, port, listen.max_brokers))
        return port

    def port_or_none(self, node_id: int) -> int | None:
        """As `port_for`, but None (logged once per node) for a node with no port: answers to
        clients leave such a node out rather than fail, so the other brokers stay usable."""
        try:
            return self.port_for(node_id)
        except ProxyError as exc:
            if node_id not in self._unmapped and len(self._unmapped) < _MAX_UNMAPPED_LOGGED:
                self._unmapped.add(node_id)
                log.error("%s; answers to clients leave node %d out", exc, node_id)
                self.metrics.unmapped_nodes.set(len(self._unmapped))
            return None

    @property
    def bootstrap_port(self) -> int:
        return int(self._listeners[None].sockets[0].getsockname()[1])

    @property
    def bootstrap_servers(self) -> tuple[tuple[str, int], ...]:
        return self._bootstrap

    def knows_nodes(self, nodes: dict[int, tuple[str, int]]) -> bool:
        """True when every node is known at that address and has its listener open."""
        return all(
            self._nodes.get(node_id) == address and node_id in self._listeners
            for node_id, address in nodes.items()
        )

    async def learn_node(self, node_id: int, address: tuple[str, int]) -> None:
        """Remember where node `node_id` lives and make sure its listener is open."""
        self._nodes[node_id] = address
        await self._ensure_listener(node_id)

    async def learn_node_or_log(self, node_id: int, address: tuple[str, int]) -> None:
        """As `learn_node`, for a node an answer to a client names: a listener that cannot
        open (its port taken by another process) is logged once, and the answer still goes out,
        so one broker's port never fails every client's Metadata request."""
        try:
            await self.learn_node(node_id, address)
        except (OSError, ProxyError) as exc:
            if node_id not in self._listener_failures:
                if len(self._listener_failures) < _MAX_UNMAPPED_LOGGED:
                    self._listener_failures.add(node_id)
                log.error("cannot open the listener for node %d: %s", node_id, exc)

    async def _ensure_listener(self, node_id: int | None) -> None:
        if node_id in self._listeners or self._stopping:
            return
        async with self._listener_lock:
            if node_id in self._listeners:
                return
            port = self.config.listen.port if node_id is None else self.port_for(node_id)
            loop = asyncio.get_running_loop()
            server = await loop.create_server(
                functools.partial(self._new_connection, node_id),
                host=self.config.listen.host,
                port=port,
                ssl=self._client_ssl,
                reuse_address=True,
                reuse_port=self._reuse_port,
            )
            self._listeners[node_id] = server
            bound = server.sockets[0].getsockname()
            what = "bootstrap" if node_id is None else f"node {node_id}"
            log.info("listening for %s on %s:%s", what, bound[0], bound[1])

    # ---- upstream ----

    async def open_upstream(
        self, client: ClientConnection, node_id: int | None
    ) -> UpstreamConnection:
        if node_id is None:
            candidates = list(self._bootstrap)
        else:
            if node_id not in self._nodes:
                await self.refresh_nodes()
            if node_id not in self._nodes:
                raise ProxyError(f"the cluster does not name node {node_id}")
            candidates = [self._nodes[node_id]]
        errors = []
        for host, port in candidates:
            try:
                upstream = await self._connect(client, host, port)
            except (OSError, TimeoutError) as exc:
                if out_of_fds(exc):  # the proxy's shortage, not the broker's: not counted
                    what = f"closed the connection of client {client.peer}: no descriptor left"
                    self.fds.report(f"{what} for its connection to {host}:{port}", exc)
                    raise OutOfFileDescriptors("out of file descriptors") from exc
                why = describe_failure(exc, self.config.upstream.connect_timeout_ms / 1000)
                errors.append(f"{host}:{port}: {why}")
                self.metrics.connect_failures.labels(f"{host}:{port}").inc()
                log.warning("upstream %s:%s unreachable: %s", host, port, why)
                continue
            self._upstreams += 1
            self.metrics.upstream_connections.inc()
            return upstream
        raise ProxyError("no upstream reachable (" + "; ".join(errors) + ")")

    async def _connect(self, client: ClientConnection, host: str, port: int) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        timeout = self.config.upstream.connect_timeout_ms / 1000
        _, upstream = await asyncio.wait_for(
            loop.create_connection(
                lambda: UpstreamConnection(client, self.config.limits.max_frame_bytes),
                host,
                port,
                ssl=self._upstream_ssl,
                server_hostname=host if self._upstream_ssl is not None else None,
            ),
            timeout,
        )
        assert upstream.transport is not None
        upstream.transport.set_write_buffer_limits(high=self.config.limits.write_buffer_high_bytes)
        return upstream

    async def refresh_nodes(self, *, strict: bool = False) -> bool:
        """Ask a bootstrap server for Metadata and learn the brokers it names; True when one
        answered. A client may reach a broker listener before the proxy (restarted, say) has
        seen an answer naming that broker.

        `strict` (at start): a node with no port raises ProxyError, so `serve` refuses to run
        rather than serve part of the cluster; later such a node is logged and left out.

        A SASL-only listener closes the connection on the proxy's Metadata request (it carries
        no credentials) but answers ApiVersions, which Kafka serves before authentication: such
        a cluster has answered too, and its brokers are learnt from clients' answers."""
        from kvproxy.proxy.upstream_client import (  # noqa: PLC0415
            answers_api_versions,
            fetch_broker_addresses,
        )

        timeout = self.config.upstream.connect_timeout_ms / 1000
        problems = []
        for host, port in self._bootstrap:
            try:
                nodes = await fetch_broker_addresses(
                    host, port, self._upstream_ssl, timeout, connections=self._admin
                )
            except (OSError, TimeoutError, ProtocolError) as exc:
                why = describe_failure(exc, timeout)
                if isinstance(exc, ConnectionError) and await answers_api_versions(
                    host, port, self._upstream_ssl, timeout
                ):
                    self._answered(
                        f"the cluster answered ApiVersions at {host}:{port} but closed the "
                        f"connection on Metadata ({why}): a listener that requires "
                        "authentication? Broker listeners open as clients' answers name them",
                        logging.WARNING,
                    )
                    return True
                problems.append(f"metadata from {host}:{port} failed: {why}")
                continue
            for node_id, address in sorted(nodes.items()):
                if strict:
                    await self.learn_node(node_id, address)
                elif self.port_or_none(node_id) is not None:
                    await self.learn_node_or_log(node_id, address)
            self._answered(f"the cluster answered: {len(nodes)} broker(s) at {host}:{port}")
            return True
        problem = "; ".join(problems)
        if problem != self._cluster_problem:  # each new reason once, not every retry
            log.warning("%s", problem)
        self._cluster_problem = problem
        return False

    def _answered(self, what: str, level: int = logging.INFO) -> None:
        first = self._cluster_answer is None
        late = first and self._cluster_problem is not None
        self._cluster_answer = what
        self._cluster_problem = None
        if first:
            self._ready_cache = (float("-inf"), False, "")  # /readyz: check again now
        if late:  # serve logged "not ready" at start: say when that ended
            log.log(level, "kvproxy ready: %s", what)
        elif first and level > logging.INFO:
            log.log(level, "%s", what)

    @property
    def cluster_answered(self) -> bool:
        """Whether a bootstrap server has answered the proxy's Metadata request (or, closing
        the connection on it, ApiVersions)."""
        return self._cluster_answer is not None

    @property
    def cluster_problem(self) -> str | None:
        """Why the last Metadata request failed (None after an answer)."""
        return self._cluster_problem

    async def sweep(self) -> None:
        """Close idle and stalled client connections: one pass over them every tick.

        One task for the whole proxy instead of a timer per connection, so neither a read nor a
        request ever touches a timer. A tenth of the shorter timeout (between 10 ms and 5 s) per
        tick: a connection is closed at most that much later than its timeout.
        """
        limits = self.config.limits
        idle_after = limits.idle_timeout_ms / 1000
        stall_after = limits.request_timeout_ms / 1000
        frame_after = limits.frame_receive_timeout_ms / 1000
        tick = min(max(min(idle_after, stall_after, frame_after) / 10, _SWEEP_MIN_S), _SWEEP_MAX_S)
        loop = asyncio.get_running_loop()
        while not self._stopping:
            await asyncio.sleep(tick)
            now = loop.time()
            for client in list(self._clients):
                client.check_timeouts(now, idle_after, stall_after)
            self._log_refusals(now)

    async def watch_readiness(self) -> None:
        """Keep `kvproxy_ready` current even when nothing polls /readyz; until the cluster has
        answered a Metadata request, ask again every `METADATA_RETRY_S`."""
        while not self._stopping:
            if not self.cluster_answered:
                await self.refresh_nodes()
            await self.readiness()
            await asyncio.sleep(READINESS_INTERVAL_S if self.cluster_answered else METADATA_RETRY_S)

    async def readiness(self) -> tuple[bool, str]:
        """Ready once the cluster has answered the proxy's Metadata request and while at least
        one bootstrap server accepts a connection (checked at most once a second)."""
        loop = asyncio.get_running_loop()
        checked_at, ready, why = self._ready_cache
        if loop.time() - checked_at < 1.0:
            return ready, why
        if not self.cluster_answered:
            why = f"not ready: {self._cluster_problem or 'the cluster has not answered yet'}"
            self._ready_cache = (loop.time(), False, why)
            self.metrics.ready.set(0)
            return False, why
        ready, why = False, "no upstream reachable"
        timeout = min(1.0, self.config.upstream.connect_timeout_ms / 1000)
        for host, port in self._bootstrap:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
            except (OSError, TimeoutError) as exc:
                if out_of_fds(exc):  # say so, rather than "no upstream reachable"
                    self.fds.report("the readiness check could not open a connection", exc)
                    why = f"not ready: {describe_fd_shortage(exc)}"
                    break
                continue
            writer.close()
            ready, why = True, f"ready: upstream {host}:{port} reachable"
            break
        if ready and self.journal is not None and self.journal.degraded:
            problem = self.journal.degraded
            why = f"ready, degraded: the quarantine journal cannot be written: {problem}"
        self._ready_cache = (loop.time(), ready, why)
        self.metrics.ready.set(1 if ready else 0)
        return ready, why

    def connection_opened(self, client: ClientConnection) -> bool:
        """Count a new client connection; False (and counted as refused) when it would pass
        `limits.max_connections_per_listener` or `limits.max_connections_per_client`."""
        limits = self.config.limits
        listener, host = client.node_id, client.client_host
        if (
            self._per_listener[listener] >= limits.max_connections_per_listener
            or self._per_client[host] >= limits.max_connections_per_client
        ):
            self.metrics.closed.labels(CloseReason.TOO_MANY_CONNECTIONS).inc()
            self._refused += 1
            self._log_refusals(asyncio.get_running_loop().time(), client)
            return False
        self._per_listener[listener] += 1
        self._per_client[host] += 1
        self._clients.add(client)
        self.metrics.client_connections.inc()
        return True

    def _log_refusals(self, now: float, client: ClientConnection | None = None) -> None:
        """One line per `REFUSAL_LOG_INTERVAL_S` at most, however many connections a flood
        brings: the first refusal of a quiet period at once, the rest summed up later."""
        if not self._refused or now - self._refused_logged_at < REFUSAL_LOG_INTERVAL_S:
            return
        limits = self.config.limits
        if client is not None and self._refused == 1:
            listener = "bootstrap" if client.node_id is None else f"node {client.node_id}"
            log.warning(
                "refusing a connection from %s on the %s listener: %d open from that address "
                "(limit %d), %d on the listener (limit %d)",
                client.peer,
                listener,
                self._per_client[client.client_host],
                limits.max_connections_per_client,
                self._per_listener[client.node_id],
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
            self.metrics.client_connections.dec()
            self._forget(self._per_listener, client.node_id)
            self._forget(self._per_client, client.client_host)

    @staticmethod
    def _forget(counts: collections.Counter[Any], key: Any) -> None:
        if counts[key] <= 1:
            del counts[key]  # a client address that has gone leaves nothing behind
        else:
            counts[key] -= 1

    def upstream_closed(self) -> None:
        self._upstreams -= 1
        self.metrics.upstream_connections.dec()

    # ---- stopping ----

    @property
    def clients(self) -> int:
        return len(self._clients)

    @property
    def upstreams(self) -> int:
        return self._upstreams

    @property
    def count(self) -> int:
        """Listeners open."""
        return len(self._listeners)

    async def drain(self, drain_timeout: float) -> None:
        """Stop accepting, let in-flight requests finish (bounded), then close every client."""
        self._stopping = True
        for server in self._listeners.values():
            server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_timeout
        while any(client.in_flight for client in self._clients) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for client in list(self._clients):
            client.close()
        for server in self._listeners.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
