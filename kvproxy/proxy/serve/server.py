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
from kvproxy.proxy.config.proxy_config import (
    RELOADABLE_SECTIONS,
    MetricsConfig,
    ProxyConfig,
    build_routing_for,
)
from kvproxy.proxy.errors import ProxyError
from kvproxy.proxy.listen.listeners import Listeners
from kvproxy.proxy.listen.tls_context import client_side_ssl, upstream_side_ssl
from kvproxy.proxy.lookups.topic_configs import TopicConfigCache
from kvproxy.proxy.lookups.topic_ids import TopicIds
from kvproxy.proxy.ops.loop_lag import watch_loop_lag
from kvproxy.proxy.ops.memory import return_large_buffers_to_the_os
from kvproxy.proxy.ops.metrics import ProxyMetrics, ReadyCheck, start_http_endpoint
from kvproxy.proxy.produce.decider import ProduceDecider
from kvproxy.proxy.refusals.sink import RejectionSink, make_journal
from kvproxy.proxy.relay.client_connection import ClientConnection
from kvproxy.proxy.relay.connection_state import ConnectionState, ResponseTap, TaskCount
from kvproxy.proxy.relay.receive_memory import ReceiveMemory, ReceiveWaiters
from kvproxy.registry.catalog import RegistryCatalog

log = logging.getLogger("kvproxy")

__all__ = ["ProxyServer", "ProxyStats", "WorkerRole"]


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


def _worker_config(config: ProxyConfig, worker: WorkerRole | None) -> ProxyConfig:
    """A worker's metrics endpoint: a loopback port of its own (the supervisor serves them all)."""
    if worker is None:
        return config
    return config.model_copy(
        update={"metrics": config.metrics.model_copy(update={"host": "127.0.0.1", "port": 0})}
    )


class ProxyServer:
    """Puts the relay's parts together and runs them: start, reload, stop. The parts are built in
    the order they need each other: each `_build_*` says why it comes where it does."""

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
        self.config = config = _worker_config(config, worker)
        self.base_dir = base_dir or Path.cwd()
        routing = routing if routing is not None else build_routing_for(config, Path.cwd())
        self._bootstrap = bootstrap if bootstrap is not None else config.upstream.addresses()
        if not self._bootstrap:
            raise ProxyError("no bootstrap servers to connect to")
        self._build_budgets()
        self._build_cluster_view()
        self._build_metrics_and_decisions(routing)
        self._build_refusals()
        self._build_connections(tap)
        self._stopping = False
        self._lag_task: asyncio.Task[None] | None = None
        self._http: asyncio.Server | None = None
        self._readiness_task: asyncio.Task[None] | None = None
        self._sweep_task: asyncio.Task[None] | None = None

    def _build_budgets(self) -> None:
        """First: the decisions, the sink, the metrics' gauges and the connections share them."""
        limits = self.config.limits
        self.decode_memory = MemoryBudget(limits.decode_memory_bytes, "limits.decode_memory_bytes")
        """What every Produce request being decoded may hold together."""
        self.receive_memory = ReceiveMemory(limits.receive_buffer_bytes)
        """What the large frames being received from clients have declared, together."""

    def _build_cluster_view(self) -> None:
        """Before the decisions and the listeners: the upstream TLS and the proxy's own lookups."""
        config = self.config
        self._upstream_ssl = upstream_side_ssl(config)
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

    def _build_metrics_and_decisions(self, routing: TopicRouting) -> None:
        """Metrics before the decisions that count into them; then the gauges reading the parts."""
        config = self.config
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

    def _build_refusals(self) -> None:
        """After the decisions (the sink uses their off-loop runner) and the crash collector."""
        index = None if self.worker is None else self.worker.index
        self.journal = make_journal(self.config.quarantine, self.base_dir, index)
        self.metrics.watch_journal(lambda: self.journal)
        self.sink = RejectionSink(
            self.config,
            self.metrics,
            journal=self.journal,
            bootstrap=self._bootstrap,
            upstream_ssl=self._upstream_ssl,
            decode_memory=self.decode_memory,
            off_loop=self.decisions.off_loop,
        )

    def _build_connections(self, tap: ResponseTap | None) -> None:
        """Last: the listeners and the state every connection is handed take the parts above."""
        self.listeners = Listeners(
            self.config,
            self._bootstrap,
            self.metrics,
            self.journal,
            self._new_connection,
            client_ssl=client_side_ssl(self.config),
            upstream_ssl=self._upstream_ssl,
            reuse_port=self.worker is not None,
            admin_connections=self.admin_connections,
        )
        self._tasks = TaskCount()
        self.connection_state = ConnectionState(
            limits=self.config.limits,
            metrics=self.metrics,
            buffer_pool=BufferPool(),
            receive=ReceiveWaiters(self.receive_memory, self.metrics),
            decisions=self.decisions,
            sink=self.sink,
            nodes=self.listeners.brokers,
            connections=self.listeners.connections,
            tasks=self._tasks,
            tap=tap,
            unknown_apis=self.config.apis.unknown,
        )

    def _new_connection(self, node_id: int | None) -> ClientConnection:
        return ClientConnection(self.connection_state, node_id)

    @property
    def routing(self) -> TopicRouting:
        """The policy rules in force."""
        return self.decisions.routing

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
        if self.config.metrics.enabled:
            self._http = await _open_metrics_endpoint(
                self.config.metrics, self.metrics, self.listeners.readiness.check
            )

        loop = asyncio.get_running_loop()
        self._readiness_task = loop.create_task(self.listeners.watch_readiness())
        self._sweep_task = loop.create_task(self.listeners.sweep())
        self._lag_task = loop.create_task(watch_loop_lag(self.metrics, lambda: self._stopping))

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


async def _open_metrics_endpoint(
    settings: MetricsConfig, metrics: ProxyMetrics, ready: ReadyCheck
) -> asyncio.Server | None:
    """/metrics, /healthz and /readyz, or None (logged) when the port cannot be had."""
    try:
        http = await start_http_endpoint(settings.host, settings.port, metrics, ready)
    except OSError as exc:  # the data path matters more than its metrics
        log.error("metrics endpoint %s:%s unavailable: %s", settings.host, settings.port, exc)
        return None
    bound = http.sockets[0].getsockname()
    log.info("metrics, /healthz and /readyz on http://%s:%s", bound[0], bound[1])
    return http
