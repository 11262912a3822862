"""Opening a client connection's upstream side: to a bootstrap server, or to the one broker its
listener stands for, counted while it is open.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING

from kvproxy.proxy.cluster.broker_directory import BrokerDirectory
from kvproxy.proxy.cluster.metadata_refresh import MetadataRefresh
from kvproxy.proxy.cluster.upstream_failures import describe_failure
from kvproxy.proxy.config.proxy_config import LimitsConfig
from kvproxy.proxy.errors import ProxyError
from kvproxy.proxy.ops.fds import FdExhaustion, OutOfFileDescriptors, out_of_fds
from kvproxy.proxy.ops.log_limits import LineLimit
from kvproxy.proxy.ops.metrics import ProxyMetrics
from kvproxy.proxy.relay.upstream_connection import UpstreamConnection

if TYPE_CHECKING:
    from kvproxy.proxy.relay.client_connection import ClientConnection

log = logging.getLogger("kvproxy")
_unreachable = LineLimit("upstream unreachable", log)

MAX_OTHER_UPSTREAM_LABELS = 32
"""Addresses besides the bootstrap servers that get their own `upstream` label in
`kvproxy_upstream_connect_failures_total` (a broker may name any host and port); the rest are
counted as `other`."""


class UpstreamDialer:
    """Connects a client connection to its broker (any live bootstrap server for the bootstrap
    listener); a failure is counted per address, a shortage of descriptors said as such."""

    def __init__(
        self,
        brokers: BrokerDirectory,
        metadata: MetadataRefresh,
        metrics: ProxyMetrics,
        fds: FdExhaustion,
        *,
        limits: LimitsConfig,
        upstream_ssl: ssl.SSLContext | None,
        connect_timeout_s: float,
    ) -> None:
        self._brokers = brokers
        self._metadata = metadata
        self._metrics = metrics
        self._fds = fds
        self._limits = limits
        self._upstream_ssl = upstream_ssl
        self._timeout = connect_timeout_s
        self.open_count = 0
        """Upstream connections open now."""
        self._other_labels: set[str] = set()
        """Addresses besides the bootstrap servers with a label of their own."""

    async def open(self, client: ClientConnection, node_id: int | None) -> UpstreamConnection:
        """The upstream side of `client`, which came through the listener of `node_id`."""
        if node_id is None:
            candidates = list(self._brokers.bootstrap_servers)
        else:
            address = self._brokers.address_of(node_id)
            if address is None:
                await self._metadata.refresh()
                address = self._brokers.address_of(node_id)
            if address is None:
                raise ProxyError(f"the cluster does not name node {node_id}")
            candidates = [address]
        errors = []
        for host, port in candidates:
            try:
                upstream = await self._connect(client, host, port)
            except (OSError, TimeoutError, UnicodeError) as exc:  # Unicode: a host IDNA refuses
                if out_of_fds(exc):  # the proxy's shortage, not the broker's: not counted
                    what = f"closed the connection of client {client.peer}: no descriptor left"
                    self._fds.report(f"{what} for its connection to {host}:{port}", exc)
                    raise OutOfFileDescriptors("out of file descriptors") from exc
                why = describe_failure(exc, self._timeout)
                errors.append(f"{host}:{port}: {why}")
                self._metrics.connect_failures.labels(self._label(host, port)).inc()
                _unreachable.log(logging.WARNING, "upstream %s:%s unreachable: %s", host, port, why)
                continue
            self.open_count += 1
            self._metrics.upstream_connections.inc()
            return upstream
        raise ProxyError("no upstream reachable (" + "; ".join(errors) + ")")

    def _label(self, host: str, port: int) -> str:
        """The `upstream` label of a failed address: itself for a bootstrap server and the first
        `MAX_OTHER_UPSTREAM_LABELS` others, `other` beyond."""
        address = f"{host}:{port}"
        if (host, port) in self._brokers.bootstrap_servers or address in self._other_labels:
            return address
        if len(self._other_labels) < MAX_OTHER_UPSTREAM_LABELS:
            self._other_labels.add(address)
            return address
        return "other"

    def closed(self) -> None:
        """An upstream connection this opened has closed."""
        self.open_count -= 1
        self._metrics.upstream_connections.dec()

    async def _connect(self, client: ClientConnection, host: str, port: int) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        _, upstream = await asyncio.wait_for(
            loop.create_connection(
                lambda: UpstreamConnection(
                    client, self._limits.max_frame_bytes, self._limits.write_buffer_high_bytes
                ),
                host,
                port,
                ssl=self._upstream_ssl,
                server_hostname=host if self._upstream_ssl is not None else None,
            ),
            self._timeout,
        )
        return upstream
