"""The SNI listener's choice of node, made during the TLS handshake from the client's server name.

The bootstrap's name serves the bootstrap; a broker's name serves that broker once the cluster
has named it. Anything else is refused with a TLS alert (`kvproxy.proxy.listen.tls_accept.Refusal`)
before any broker is connected to. A broker's name for a node the directory does not know yet
(a broker added to the cluster, or named only to another worker of `--workers`) is refused too,
and the cluster is asked again in the background, so that the client's retry reaches it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from kvproxy.proxy.cluster.broker_directory import BrokerDirectory
from kvproxy.proxy.config.listen_config import ListenSni
from kvproxy.proxy.config.sni_names import NO_ROUTE
from kvproxy.proxy.errors import ProxyError
from kvproxy.proxy.listen.tls_accept import Refusal
from kvproxy.proxy.ops.log_limits import LineLimit

log = logging.getLogger("kvproxy")
_refresh_failed = LineLimit("SNI refresh failed", log)

REFRESH_INTERVAL_S: Final = 1.0
"""At most one Metadata request a second for names of unknown nodes, however many clients
send them (a client cannot make the proxy hammer the cluster)."""


class SniRoute:
    """`kvproxy.proxy.listen.tls_accept.Route` of the SNI listener."""

    def __init__(
        self,
        sni: ListenSni,
        brokers: BrokerDirectory,
        refresh: Callable[[], Awaitable[bool]],
    ) -> None:
        self._names = sni.names
        self._without_sni = sni.without_sni
        self._brokers = brokers
        self._refresh = refresh
        self._refreshing: asyncio.Task[None] | None = None
        self._refreshed_at = float("-inf")

    def __call__(self, server_name: str | None) -> int | Refusal | None:
        if server_name is None:
            return None if self._without_sni == "bootstrap" else Refusal("no_sni")
        node_id = self._names.route(server_name)
        if node_id is NO_ROUTE:
            return Refusal("no_matching_name")
        if node_id is None or self._brokers.address_of(node_id) is not None:
            return node_id
        self._refresh_soon()
        return Refusal("unknown_node")

    def _refresh_soon(self) -> None:
        if self._refreshing is not None and not self._refreshing.done():
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._refreshed_at < REFRESH_INTERVAL_S:
            return
        self._refreshed_at = loop.time()
        self._refreshing = loop.create_task(self._ask_the_cluster())

    async def _ask_the_cluster(self) -> None:
        try:
            await self._refresh()
        except (OSError, ProxyError) as exc:  # the next unknown name asks again
            _refresh_failed.log(
                logging.WARNING,
                "asking the cluster for its brokers (an unknown node's name): %s",
                exc,
            )

    def stop(self) -> None:
        """Cancel the refresh under way (the listeners are closing)."""
        if self._refreshing is not None:
            self._refreshing.cancel()
