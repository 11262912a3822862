"""Running the proxy: the embedded broker if asked for, uvloop, signals, hot reload, graceful
shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from kvproxy.policies.config import TopicRouting
from kvproxy.proxy.cluster.readiness import METADATA_RETRY_S
from kvproxy.proxy.config.proxy_config import ProxyConfig, build_routing_for
from kvproxy.proxy.serve.embedded import EmbeddedBroker, advertised, run_embedded_broker
from kvproxy.proxy.serve.reload import (
    DEFAULT_POLL_INTERVAL,
    ConfigReloader,
    FileSignature,
    ReloadListener,
)
from kvproxy.proxy.serve.server import ProxyServer, WorkerRole
from kvproxy.proxy.serve.signals import queue_sighup, take_queued_sighups

log = logging.getLogger("kvproxy")


@contextlib.asynccontextmanager
async def running_proxy(
    config: ProxyConfig,
    config_dir: Path | None = None,
    worker: WorkerRole | None = None,
    routing: TopicRouting | None = None,
) -> AsyncIterator[ProxyServer]:
    """A started proxy (and its embedded broker when `upstream.embedded`), stopped on exit.

    `routing`: the rules of `config` when the caller has built them (closed on exit, as the
    ones built here are); schema files named by policies resolve against `config_dir` (the
    config file's folder)."""
    if routing is None:
        routing = build_routing_for(config, config_dir or Path.cwd())
    with contextlib.ExitStack() as stack:
        bootstrap = None
        if config.upstream.embedded:
            broker: EmbeddedBroker = stack.enter_context(run_embedded_broker())
            log.info("embedded broker listening on %s", broker.bootstrap)
            bootstrap = ((broker.host, broker.port),)
            journal = config.quarantine.dir
            if journal is not None:  # for `kvproxy quarantine replay`, which writes to it
                base = config_dir or Path.cwd()
                stack.enter_context(
                    advertised(journal if journal.is_absolute() else base / journal, broker)
                )
        server = ProxyServer(config, bootstrap, routing=routing, base_dir=config_dir, worker=worker)
        await server.start()
        try:
            yield server
        finally:
            await server.stop()
            server.routing.close()  # the rules in force: a reload closes the ones it replaces


REJECTION_FLUSH_S = 5.0
"""How often windows of the rejection log's rate limit are ended (and summaries logged)."""


async def serve(
    config: ProxyConfig,
    config_dir: Path | None = None,
    on_ready: Callable[[ProxyServer], None] | None = None,
    *,
    config_path: Path | None = None,
    config_loaded: FileSignature | None = None,
    reload_poll_s: float = DEFAULT_POLL_INTERVAL,
    on_reload: ReloadListener | None = None,
    worker: WorkerRole | None = None,
    routing: TopicRouting | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then drain in-flight requests and close.

    With `config_path`, the policy rules are reloaded from it on SIGHUP and when the file changes
    (checked every `reload_poll_s` seconds; 0 turns the file check off) since it was read
    (`config_loaded`: its `file_signature` then, else when the proxy is up); `on_reload` is told the
    result of each attempt ("success" or "failure")."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Every handler before any listener opens: a signal that comes early is never fatal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sighup = _Sighup()
    loop.add_signal_handler(signal.SIGHUP, sighup.received)
    sighup.take_early()  # after the handler: one in between is queued, not lost
    watcher = None
    if worker is not None:  # a worker does not outlive its supervisor
        watcher = loop.create_task(_watch_parent(stop), name="kvproxy-parent-watch")
    reloader: ConfigReloader | None = None
    try:
        async with running_proxy(config, config_dir, worker, routing) as server:
            _log_started(server)
            _freeze_startup_heap()
            if config_path is not None:
                reloader = ConfigReloader(
                    server,
                    config_path,
                    base_dir=config_dir,
                    poll_interval=reload_poll_s,
                    on_result=_reload_listener(server, on_reload),
                    loaded=config_loaded if config_loaded is not None else "now",
                )
                reloader.start(sighup=False)
                sighup.live(reloader)
            if worker is not None:  # listeners open, SIGHUP handled: the supervisor may count on it
                worker.announce(server.metrics_port)
            flusher = loop.create_task(_flush_rejections(server), name="kvproxy-rejection-log")
            if on_ready is not None:
                on_ready(server)
            try:
                await stop.wait()
            finally:
                log.info("stopping: no new connections, draining in-flight requests")
                sighup.stopping()
                flusher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await flusher
                if reloader is not None:
                    await reloader.stop()
        server.sink.rejection_log.flush(everything=True)
        log.info("kvproxy stopped")
    finally:
        if watcher is not None:
            watcher.cancel()
        if reloader is not None:
            reloader.close()  # rules replaced by a reload, once no request can still use them
        loop.remove_signal_handler(signal.SIGHUP)
        queue_sighup()  # until the process exits


def _freeze_startup_heap() -> None:
    """Move what start-up built (modules, the Kafka schemas, the rules) out of the collector's
    sight: a full collection walked every one of those objects, and with a few allocations
    per request that was about a tenth of the proxy's CPU under small requests
    (docs/benchmarks.md, benchmark 8). What a request allocates is still collected."""
    gc.collect()
    gc.freeze()


def _log_started(server: ProxyServer) -> None:
    """ "ready" only once the cluster has answered; otherwise why not, while listeners serve."""
    where = server.listeners.describe()
    if server.listeners.readiness.cluster_answered:
        log.info("kvproxy ready: %s", where)
    else:
        log.warning(
            "kvproxy listening (%s) but not ready: %s; asking again every %.0f s",
            where,
            server.listeners.readiness.cluster_problem or "the cluster has not answered",
            METADATA_RETRY_S,
        )


class _Sighup:
    """SIGHUP for the whole life of `serve`: queued until the configuration is live, then a
    reload, and ignored (logged) while stopping. Never the default action, which kills."""

    def __init__(self) -> None:
        self._reloader: ConfigReloader | None = None
        self._queued = 0
        self._stopping = False

    def take_early(self) -> None:
        """Those that came before the event loop handled SIGHUP (see
        `kvproxy.proxy.serve.signals`)."""
        early = take_queued_sighups()
        if early:
            self._queued += early
            log.info("SIGHUP while starting: reloading once the configuration is live")

    def received(self) -> None:
        if self._stopping:
            log.info("SIGHUP while stopping: ignored")
        elif self._reloader is None:
            self._queued += 1
            log.info("SIGHUP before the configuration is live: reloading once it is")
        else:
            self._reloader.request_reload("SIGHUP")  # read and built off the event loop

    def live(self, reloader: ConfigReloader) -> None:
        self._reloader = reloader
        if self._queued:
            self._queued = 0
            reloader.request_reload("SIGHUP")

    def stopping(self) -> None:
        self._stopping = True


def _reload_listener(server: ProxyServer, also: ReloadListener | None) -> ReloadListener:
    """Counts every reload result in the server's metrics, then tells `also`."""

    def report(result: str) -> None:
        server.record_reload(result)
        if also is not None:
            also(result)

    return report


PARENT_CHECK_S = 1.0


async def _watch_parent(stop: asyncio.Event) -> None:
    """Stop when the supervisor that started this worker is gone (killed, say)."""
    parent = os.getppid()
    while not stop.is_set():
        await asyncio.sleep(PARENT_CHECK_S)
        if os.getppid() != parent:
            log.error("the supervisor (pid %d) is gone: stopping this worker", parent)
            stop.set()


async def _flush_rejections(server: ProxyServer) -> None:
    while True:
        await asyncio.sleep(REJECTION_FLUSH_S)
        server.sink.rejection_log.flush()


def run(
    config: ProxyConfig,
    config_dir: Path | None = None,
    *,
    config_path: Path | None = None,
    config_loaded: FileSignature | None = None,
    reload_poll_s: float = DEFAULT_POLL_INTERVAL,
    worker: WorkerRole | None = None,
    routing: TopicRouting | None = None,
) -> None:
    """Blocking entry point of `kvproxy serve` and of each of its workers (uvloop if installed)."""
    main = serve(
        config,
        config_dir,
        config_path=config_path,
        config_loaded=config_loaded,
        reload_poll_s=reload_poll_s,
        worker=worker,
        routing=routing,
    )
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        asyncio.run(main)
    else:
        uvloop.run(main)
