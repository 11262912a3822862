"""A broker naming node 0 at a new address every time it is asked, each refused: what the
proxy's dialer counts (`kvproxy_upstream_connect_failures_total`), for the label-bound test and
bench/log_floods.py."""

from __future__ import annotations

import asyncio
import contextlib

from kvproxy.proxy.config.proxy_config import LimitsConfig
from kvproxy.proxy.errors import ProxyError
from kvproxy.proxy.ops.fds import FdExhaustion
from kvproxy.proxy.ops.metrics import ProxyMetrics
from kvproxy.proxy.relay.upstream_dialer import UpstreamDialer
from tests.harness.tansu import free_port


class _Brokers:
    """A broker directory that names node 0 at a new (closed) port every time it is asked."""

    def __init__(self, bootstrap: tuple[str, int]) -> None:
        self.bootstrap_servers = (bootstrap,)
        self._ports = iter(range(20_000, 65_000))

    def address_of(self, node_id: int) -> tuple[str, int]:
        return "127.0.0.1", next(self._ports)


class _Client:
    peer = "127.0.0.1:1"


def dial_new_ports(ports: int, metrics: ProxyMetrics) -> str:
    """Dial a closed bootstrap server once, then node 0 at `ports` new closed ports, counting
    into `metrics`; the bootstrap server's address."""
    bootstrap = ("127.0.0.1", free_port())
    dialer = UpstreamDialer(
        _Brokers(bootstrap),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]  # never asked: every node has an address
        metrics,
        FdExhaustion(),
        limits=LimitsConfig(),
        upstream_ssl=None,
        connect_timeout_s=5,
    )

    async def dial_all() -> None:
        for node_id in [None, *([0] * ports)]:
            with contextlib.suppress(ProxyError):
                await dialer.open(_Client(), node_id)  # type: ignore[arg-type]

    asyncio.run(dial_all())
    return f"{bootstrap[0]}:{bootstrap[1]}"


def connect_failure_series(metrics: ProxyMetrics) -> dict[str, float]:
    """`kvproxy_upstream_connect_failures_total` by its `upstream` label."""
    return {
        sample.labels["upstream"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "kvproxy_upstream_connect_failures"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
