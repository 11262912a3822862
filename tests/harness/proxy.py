"""Run kvproxy in-process, on its own uvloop event loop in a background thread.

Blocking clients (confluent-kafka, kafka-python, kcat) can then talk to it from the test thread,
and the test can still inspect the server (`stats()`, `nodes`) between steps.

    with run_proxy("127.0.0.1:9092") as proxy:
        proxy.bootstrap            # "127.0.0.1:PORT" for clients
        proxy.stats()              # connection and task counts
        proxy.broker_port(111)     # the listener that stands for upstream node 111
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import socket
import threading
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import uvloop

from kvproxy.proxy.config.proxy_config import ProxyConfig, parse_config
from kvproxy.proxy.serve.server import ProxyServer, ProxyStats

T = TypeVar("T")
HOST = "127.0.0.1"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


_HANDED_OUT: collections.deque[tuple[float, range]] = collections.deque(maxlen=16)
"""The ranges this process gave in the last `_HELD_S` seconds: a config built and not yet
listening holds none of its ports, so a second range is kept clear of it by this record, not by
the bind check."""
_HELD_S = 5.0


def _worker_span(top: int) -> range:
    """This pytest-xdist worker's share of the ports below `top`: two workers never race for the
    same port between the bind check here and a proxy's own bind."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker.removeprefix("gw")) if worker.removeprefix("gw").isdigit() else 0
    width = (top - 10_000) // max(count, 1)
    start = 10_000 + (index % max(count, 1)) * width
    return range(start, start + width)


def free_port_range(size: int, attempts: int = 200) -> int:
    """A base port such that base .. base+size-1 are all free right now.

    Taken below the ephemeral ports, where the operating system puts `free_port()`'s ports and
    every outgoing connection: a bootstrap port from `free_port()` never falls inside a broker
    port range from here (a config that has it so is refused). Each xdist worker draws from
    its own share, and no range overlaps one this process handed out recently."""
    span = _worker_span(_ephemeral_low())
    for _ in range(attempts):
        base = random.randrange(span.start, span.stop - size)
        ports = range(base, base + size)
        recent = [given for at, given in _HANDED_OUT if time.monotonic() - at < _HELD_S]
        if any(ports.start < given.stop and given.start < ports.stop for given in recent):
            continue
        sockets = []
        try:
            for port in ports:
                sock = socket.socket()
                sockets.append(sock)
                sock.bind((HOST, port))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        _HANDED_OUT.append((time.monotonic(), ports))
        return base
    raise RuntimeError(f"no run of {size} free ports found")


@dataclass
class RunningProxy:
    server: ProxyServer
    loop: asyncio.AbstractEventLoop
    config: ProxyConfig
    responses: list[tuple[int, int, bytes]]
    """Every answer sent to a client: (api key, api version, frame), in the order sent."""

    @property
    def host(self) -> str:
        return self.config.listen.public_host

    @property
    def port(self) -> int:
        return self.server.listeners.bootstrap_port

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        port = self.server.metrics_port
        assert port is not None, "metrics are disabled or their port could not be bound"
        return f"http://{self.config.metrics.host}:{port}"

    def broker_port(self, node_id: int) -> int:
        return self.server.listeners.brokers.port_for(node_id)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    def stats(self) -> ProxyStats:
        async def read() -> ProxyStats:
            return self.server.stats()

        return self.call(read())

    @property
    def nodes(self) -> dict[int, tuple[str, int]]:
        async def read() -> dict[int, tuple[str, int]]:
            return dict(self.server.listeners.brokers._addresses)  # the brokers it has learned

        return self.call(read())

    def wait_until_idle(self, timeout: float = 10.0) -> ProxyStats:
        """Poll until no client connection, upstream connection or task is left."""
        deadline = self.loop.time() + timeout
        stats = self.stats()
        while self.loop.time() < deadline:
            stats = self.stats()
            if not (stats.client_connections or stats.upstream_connections or stats.pending_tasks):
                break
            threading.Event().wait(0.05)
        return stats


def proxy_config(
    bootstrap: str | list[str],
    *,
    lowest_node_id: int = 0,
    max_brokers: int = 200,
    **sections: dict[str, Any],
) -> ProxyConfig:
    """A config listening on free loopback ports in front of `bootstrap`."""
    servers = [bootstrap] if isinstance(bootstrap, str) else bootstrap
    listen = {
        "host": HOST,
        "port": 0,
        "broker_port_base": free_port_range(max_brokers),
        "lowest_node_id": lowest_node_id,
        "max_brokers": max_brokers,
        **sections.pop("listen", {}),
    }
    upstream = {"bootstrap_servers": servers, **sections.pop("upstream", {})}
    metrics = {"port": 0, **sections.pop("metrics", {})}  # an ephemeral port per proxy
    return parse_config({"listen": listen, "upstream": upstream, "metrics": metrics, **sections})


@contextlib.contextmanager
def run_proxy(
    bootstrap: str | list[str] | None = None, *, config: ProxyConfig | None = None, **kwargs: Any
) -> Iterator[RunningProxy]:
    """Start a proxy in front of `bootstrap` (or with `config`), stop it on exit."""
    if config is None:
        assert bootstrap is not None
        config = proxy_config(bootstrap, **kwargs)
    loop = uvloop.new_event_loop()
    started = threading.Event()
    thread = threading.Thread(target=_run_loop, args=(loop, started), daemon=True)
    thread.start()
    started.wait()
    responses: list[tuple[int, int, bytes]] = []
    server = ProxyServer(config, tap=lambda *answer: responses.append(answer))
    running = RunningProxy(server, loop, config, responses)
    try:
        running.call(server.start())
        yield running
    finally:
        with contextlib.suppress(Exception):
            running.call(server.stop(drain_timeout=2.0))
        with contextlib.suppress(Exception):  # as asyncio.run does: nothing left pending
            running.call(_cancel_the_rest(), timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


async def _cancel_the_rest() -> None:
    """Cancel every other task of the loop and let each finish, so none is destroyed pending
    when the loop closes (its "Task was destroyed" line would land in a later test's log)."""
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in rest:
        task.cancel()
    if rest:
        await asyncio.wait(rest, timeout=4)


def _run_loop(loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(started.set)
    loop.run_forever()
