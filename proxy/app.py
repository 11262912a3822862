"""Running the proxy: the embedded broker if asked for, uvloop, signals, graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from proxy.config import ProxyConfig
from proxy.embedded import EmbeddedBroker, run_embedded_broker
from proxy.server import ProxyServer, build_routing_for

log = logging.getLogger("kvproxy")


@contextlib.asynccontextmanager
async def running_proxy(
    config: ProxyConfig, config_dir: Path | None = None
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
        server = ProxyServer(config, bootstrap, routing=routing)
        await server.start()
        try:
            yield server
        finally:
            await server.stop()
            routing.close()


async def serve(
    config: ProxyConfig,
    config_dir: Path | None = None,
    on_ready: Callable[[ProxyServer], None] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then drain in-flight requests and close."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running_proxy(config, config_dir) as server:
        log.info(
            "kvproxy ready: bootstrap %s:%s, broker ports from %s",
            config.listen.public_host,
            server.bootstrap_port,
            config.listen.broker_port_base,
        )
        if on_ready is not None:
            on_ready(server)
        await stop.wait()
        log.info("stopping: no new connections, draining in-flight requests")


def run(config: ProxyConfig, config_dir: Path | None = None) -> None:
    """Blocking entry point of `kvproxy serve` (uvloop when installed)."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        asyncio.run(serve(config, config_dir))
    else:
        uvloop.run(serve(config, config_dir))
