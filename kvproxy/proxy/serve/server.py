"""The relay's lifecycle: build its parts, start, serve, reload the rules, drain and stop.

The parts, each in a module of its own: `kvproxy.proxy.listen.listeners` (the ports, and the node
directory, connection limits, upstream connects, readiness and metadata refresh it puts
together), `kvproxy.proxy.relay.client_connection` and
`kvproxy.proxy.relay.upstream_connection`
(one client connection and its broker side), `kvproxy.proxy.produce.decider` (the rules in force
and
where a
Produce request is decided), `kvproxy.proxy.refusals.sink` (log, metrics, journal and dead letters
of
what was refused). A connection is handed a `kvproxy.proxy.relay.connection_state.ConnectionState`,
never the
server.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass
from pathlib import Path

from kvproxy.client.async_connections import AdminConnections
from kvproxy.client.async_requests import topics_exist
from kvproxy.policies.config import TopicRouting
from kvproxy.protocol.budget import MemoryBudget
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.framing import BufferPool
from kvproxy.proxy.cluster.upstream_failures import describe_failure
from kvproxy.proxy.config.proxy_config import RELOADABLE_SECTIONS, ProxyConfig, build_routing_for
from kvproxy.proxy.errors import ProxyError
from kvproxy.proxy.listen.listeners import Listeners
from kvproxy.proxy.listen.tls_context import client_side_ssl, upstream_side_ssl
from kvproxy.proxy.lookups.topic_configs import TopicConfigCache
from kvproxy.proxy.lookups.topic_ids import TopicIds
from kvproxy.proxy.ops.memory import return_large_buffers_to_the_os
from kvproxy.proxy.ops.metrics import ProxyMetrics, start_http_endpoint
from kvproxy.proxy.produce.decider import ProduceDecider
from kvproxy.proxy.refusals.sink import RejectionSink, make_journal
from kvproxy.proxy.relay.client_connection import ClientConnection
from kvproxy.proxy.relay.connection_state import ConnectionState, ResponseTap, TaskCount
from kvproxy.proxy.relay.receive_memory import ReceiveMemory, ReceiveWaiters
from kvproxy.registry.catalog import RegistryCatalog

log = logging.getLogger("kvproxy")

LAG_TICK_S = 0.1
LAG_WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """This process is worker `index` of `kvproxy serve --workers N` (see
    kvproxy/proxy/serve/workers.py).

    Its listeners share their ports with the other workers (SO_REUSEPORT), its quarantine journal
    is `<quarantine.dir>/worker-<index>` (a journal has one writer), and its metrics endpoint
    listens on a loopback port of its own, written to `<state_dir>/worker-<index>.port`, where
    the supervisor reads it to serve every worker's metrics on the configured port.
    """

    index: int
    state_dir: Path

    @property
    def port_file(self) -> Path:
        return self.state_dir / f"worker-{self.index}.port"

    def announce(self, metrics_port: int | None) -> None:
        """Tell the supervisor this worker serves (and handles SIGHUP): write the port file."""
        staged = self.port_file.with_suffix(".tmp")
        staged.write_text("" if metrics_port is None else str(metrics_port))
        staged.replace(self.port_file)


@dataclass(frozen=True, slots=True)
class ProxyStats:
    client_connections: int
    upstream_connections: int
    listeners: int
    pending_tasks: int


class ProxyServer:
    """Puts the relay's parts together and runs them: start, reload, stop."""

    def __init__(
        self,
        config: ProxyConfig,
        bootstrap: tuple[tuple[str, int], ...] | None = None,
        tap: ResponseTap | None = None,
        routing: TopicRouting | None = None,
        base_dir: Path | None = None,
        *,
        worker: WorkerRole | None = None,
    ) -> None:
        self.worker = worker
        if worker is not None:
            config = config.model_copy(
                update={
                    "metrics": config.metrics.model_copy(update={"host": "127.0.0.1", "port": 0})
                }
            )
        self.config = config
        self.base_dir = base_dir or Path.cwd()
        routing = routing if routing is not None else build_routing_for(config, Path.cwd())
        self._bootstrap = bootstrap if bootstrap is not None else config.upstream.addresses()
        if not self._bootstrap:
            raise ProxyError("no bootstrap servers to connect to")
        limits = config.limits
        self.decode_memory = MemoryBudget(limits.decode_memory_bytes, "limits.decode_memory_bytes")
        """What every Produce request being decoded may hold together."""
        self.receive_memory = ReceiveMemory(limits.receive_buffer_bytes)
        """What the large frames being received from clients have declared, together."""
        self._lag_task: asyncio.Task[None] | None = None
        self._upstream_ssl = upstream_side_ssl(config)
        self._stopping = False
        self.admin_connections = AdminConnections(self._upstream_ssl)
        """The kept connections of the proxy's own requests (DescribeConfigs, Metadata)."""
        self.topic_configs = TopicConfigCache(
            lambda: self._bootstrap,
            self._upstream_ssl,
            config.topic_configs.ttl_ms / 1000,
            config.upstream.connect_timeout_ms / 1000,
            settings=config.topic_configs,
            connections=self.admin_connections,
            count=lambda outcome, names: self.metrics.topic_lookups.labels(outcome).inc(names),
        )
        self.metrics = ProxyMetrics(config.metrics.topic_label_limit)
        self.schemas = (
            None
            if config.schema_registry is None
            else RegistryCatalog(config.schema_registry, self.metrics.registry_observer())
        )
        """The schema registry's answers: per process, kept across reloads."""
        self.decisions = ProduceDecider(
            config,
            routing,
            self.topic_configs,
            self.decode_memory,
            self.metrics,
            schemas=self.schemas,
            topic_ids=TopicIds(
                lambda: self._bootstrap,
                self._upstream_ssl,
                config.upstream.connect_timeout_ms / 1000,
                config.topic_configs,
                connections=self.admin_connections,
            ),
        )
        self.metrics.decode_memory.set_function(lambda: self.decode_memory.in_use)
        self.metrics.receive_memory.set_function(lambda: self.receive_memory.in_use)
        self.metrics.topic_labels.lookup = self._topics_exist
        # A lambda, not the bound method: a reload replaces the routing.
        self.metrics.watch_policy_crashes(lambda: self.routing.crash_counts())  # noqa: PLW0108
        self.journal = make_journal(
            config.quarantine, self.base_dir, None if worker is None else worker.index
        )
        self.metrics.watch_journal(lambda: self.journal)
        self.sink = RejectionSink(
            config,
            self.metrics,
            journal=self.journal,
            bootstrap=self._bootstrap,
            upstream_ssl=self._upstream_ssl,
            decode_memory=self.decode_memory,
            off_loop=self.decisions.off_loop,
        )
        self.listeners = Listeners(
            config,
            self._bootstrap,
            self.metrics,
            self.journal,
            self._new_connection,
            client_ssl=client_side_ssl(config),
            upstream_ssl=self._upstream_ssl,
            reuse_port=worker is not None,
            admin_connections=self.admin_connections,
        )
        self._tasks = TaskCount()
        self.connection_state = ConnectionState(
            limits=limits,
            metrics=self.metrics,
            buffer_pool=BufferPool(),
            receive=ReceiveWaiters(self.receive_memory, self.metrics),
            decisions=self.decisions,
            sink=self.sink,
            nodes=self.listeners.brokers,
            connections=self.listeners.connections,
            tasks=self._tasks,
            tap=tap,
            unknown_apis=config.apis.unknown,
        )
        self._http: asyncio.Server | None = None
        self._readiness_task: asyncio.Task[None] | None = None
        self._sweep_task: asyncio.Task[None] | None = None

    def _new_connection(self, node_id: int | None) -> ClientConnection:
        return ClientConnection(self.connection_state, node_id)

    @property
    def routing(self) -> TopicRouting:
        """The policy rules in force."""
        return self.decisions.routing

    async def _watch_loop_lag(self) -> None:
        """How late a timer due every `LAG_TICK_S` runs: the longest the loop was held."""
        loop = asyncio.get_running_loop()
        recent: collections.deque[tuple[float, float]] = collections.deque()
        while not self._stopping:
            due = loop.time() + LAG_TICK_S
            await asyncio.sleep(LAG_TICK_S)
            now = loop.time()
            lag = max(0.0, now - due)
            self.metrics.loop_lag.observe(lag)
            while recent and (recent[0][0] < now - LAG_WINDOW_S or recent[0][1] <= lag):
                recent.popleft()
            while recent and recent[-1][1] <= lag:
                recent.pop()
            recent.append((now, lag))  # decreasing lags: the first is the window's longest
            self.metrics.loop_lag_max.set(recent[0][1])

    async def _topics_exist(self, topics: list[str]) -> dict[str, bool | None]:
        """Which of `topics` the cluster has, asked of the first bootstrap server that answers
        (the topic label of the metrics); ConnectionError when none does."""
        timeout = self.config.upstream.connect_timeout_ms / 1000
        problem = "none configured"
        for host, port in list(self._bootstrap):
            try:
                await self.topic_configs.label_pacer.wait()
                return await topics_exist(
                    host,
                    port,
                    self._upstream_ssl,
                    timeout,
                    topics,
                    connections=self.admin_connections,
                )
            except (OSError, TimeoutError, ProtocolError) as exc:
                problem = describe_failure(exc, timeout)
        raise ConnectionError(f"no bootstrap server answered Metadata: {problem}")

    def record_reload(self, result: str) -> None:
        """Count a configuration reload ("success" or "failure")."""
        self.metrics.reloads.labels(result).inc()

    def replace_rules(self, config: ProxyConfig, routing: TopicRouting) -> TopicRouting:
        """Swap in new policy rules (a reload); returns the old routing for the caller to close.

        Requests already decided keep their verdicts and are answered under the rules they were
        judged by (`ProduceDecision.engine`); the next request uses the new rules. Only the
        sections in `RELOADABLE_SECTIONS` are taken from `config`: the others need a restart.
        """
        self.config = self.config.model_copy(
            update={name: getattr(config, name) for name in RELOADABLE_SECTIONS}
        )
        self.topic_configs.settings = self.config.topic_configs
        return self.decisions.replace(self.config, routing)

    # ---- lifecycle ----

    async def start(self) -> None:
        """Open the bootstrap listener, then a listener for every broker the cluster names now,
        so clients holding broker addresses from an earlier run find them open."""
        return_large_buffers_to_the_os()
        if self.journal is not None:  # reading the segments is disk work: off the event loop
            report = await asyncio.get_running_loop().run_in_executor(None, self.journal.open)
            log.info(
                "quarantine journal %s: %d entries in %d segments%s",
                self.journal.directory,
                report.entries,
                report.segments,
                f", torn tail of {report.truncated_bytes} bytes truncated"
                if report.truncated_bytes
                else "",
            )
        self.listeners.fds.start()  # accept errors and the descriptor check
        await self.listeners.open_bootstrap()
        settings = self.config.metrics
        if settings.enabled:
            try:
                self._http = await start_http_endpoint(
                    settings.host, settings.port, self.metrics, self.listeners.readiness.check
                )
            except OSError as exc:  # the data path matters more than its metrics
                log.error(
                    "metrics endpoint %s:%s unavailable: %s", settings.host, settings.port, exc
                )
            else:
                bound = self._http.sockets[0].getsockname()
                log.info("metrics, /healthz and /readyz on http://%s:%s", bound[0], bound[1])

        loop = asyncio.get_running_loop()
        self._readiness_task = loop.create_task(self.listeners.watch_readiness())
        self._sweep_task = loop.create_task(self.listeners.sweep())
        self._lag_task = loop.create_task(self._watch_loop_lag())

    @property
    def metrics_port(self) -> int | None:
        if self._http is None:
            return None
        return int(self._http.sockets[0].getsockname()[1])

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish (bounded), then close everything."""
        self._stopping = True
        self.listeners.fds.stop()
        watchers = [t for t in (self._readiness_task, self._sweep_task, self._lag_task) if t]
        for task in watchers:
            task.cancel()
        if watchers:  # awaited (bounded), so none outlives stop() as a pending task
            await asyncio.wait(watchers, timeout=1.0)
        if self._http is not None:
            self._http.close()
        if drain_timeout is None:
            drain_timeout = self.config.shutdown.drain_timeout_ms / 1000
        await self.listeners.drain(drain_timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2.0
        while (
            self.listeners.connections.count or self._tasks.running or self.sink.background
        ) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        self.metrics.topic_labels.close()  # after the drain: its requests were counted
        self.decisions.close()
        self.topic_configs.close()
        self.admin_connections.close()
        if self.schemas is not None:
            await self.schemas.aclose()
        self.sink.close()  # the attempts of repeated refusals, before the journal closes
        if self.journal is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.journal.close)

    def stats(self) -> ProxyStats:
        return ProxyStats(
            client_connections=self.listeners.connections.count,
            upstream_connections=self.listeners.connections.upstreams.open_count,
            listeners=self.listeners.count,
            pending_tasks=self._tasks.running,
        )
