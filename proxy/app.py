"""Running the proxy: the embedded broker if asked for, uvloop, signals, hot reload, graceful
shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from proxy.config import ProxyConfig
from proxy.embedded import EmbeddedBroker, run_embedded_broker
from proxy.reload import DEFAULT_POLL_INTERVAL, ConfigReloader, ReloadListener
from proxy.server import ProxyServer, WorkerRole, build_routing_for

log = logging.getLogger("kvproxy")


@contextlib.asynccontextmanager
async def running_proxy(
    config: ProxyConfig, config_dir: Path | None = None, worker: WorkerRole | None = None
) -> AsyncIterator[ProxyServer]:
    """A started proxy (and its embedded broker when `upstream.embedded`), stopped on exit.

    Schema files named by policies resolve against `config_dir` (the config file's folder)."""
    routing = build_routing_for(config, config_dir or Path.cwd())
    with contextlib.ExitStack() as stack:
        bootstrap = None
        if config.upstream.embedded:
            broker: EmbeddedBroker = stack.enter_context(run_embedded_broker())
            log.info("embedded broker listening on %s", broker.bootstrap)
            bootstrap = ((broker.host, broker.port),)
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
    reload_poll_s: float = DEFAULT_POLL_INTERVAL,
    on_reload: ReloadListener | None = None,
    worker: WorkerRole | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then drain in-flight requests and close.

    With `config_path`, the policy rules are reloaded from it on SIGHUP and when the file changes
    (checked every `reload_poll_s` seconds; 0 turns the file check off); `on_reload` is told the
    result of each attempt ("success" or "failure")."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = None
    if worker is not None:  # a worker does not outlive its supervisor
        watcher = loop.create_task(_watch_parent(stop), name="kvproxy-parent-watch")
    reloader: ConfigReloader | None = None
    try:
        async with running_proxy(config, config_dir, worker) as server:
            log.info(
                "kvproxy ready: bootstrap %s:%s, broker ports from %s",
                config.listen.public_host,
                server.bootstrap_port,
                config.listen.broker_port_base,
            )
            if config_path is not None:
                reloader = ConfigReloader(
                    server,
                    config_path,
                    base_dir=config_dir,
                    poll_interval=reload_poll_s,
                    on_result=_reload_listener(server, on_reload),
                )
                reloader.start()
            if worker is not None:  # listeners open, SIGHUP handled: the supervisor may count on it
                worker.announce(server.metrics_port)
            flusher = loop.create_task(_flush_rejections(server), name="kvproxy-rejection-log")
            if on_ready is not None:
                on_ready(server)
            try:
                await stop.wait()
            finally:
                log.info("stopping: no new connections, draining in-flight requests")
                flusher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await flusher
                if reloader is not None:
                    await reloader.stop()
        server.rejection_log.flush(everything=True)
    finally:
        if watcher is not None:
            watcher.cancel()
        if reloader is not None:
            reloader.close()  # rules replaced by a reload, once no request can still use them


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
        server.rejection_log.flush()


def run(
    config: ProxyConfig,
    config_dir: Path | None = None,
    *,
    config_path: Path | None = None,
    reload_poll_s: float = DEFAULT_POLL_INTERVAL,
    worker: WorkerRole | None = None,
) -> None:
    """Blocking entry point of `kvproxy serve` and of each of its workers (uvloop if installed)."""
    main = serve(
        config, config_dir, config_path=config_path, reload_poll_s=reload_poll_s, worker=worker
    )
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        asyncio.run(main)
    else:
        uvloop.run(main)
