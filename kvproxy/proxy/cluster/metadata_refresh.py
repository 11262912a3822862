"""The proxy's own Metadata request: which brokers the cluster has, asked of a bootstrap server.

At start (strict: a node with no port stops `serve`), until the cluster first answers (every
`kvproxy.proxy.cluster.readiness.METADATA_RETRY_S`), and when a client reaches a broker listener
the proxy has not seen named yet (after a restart, say).
"""

from __future__ import annotations

import logging
import ssl

from kvproxy.client.async_connections import AdminConnections
from kvproxy.client.async_requests import answers_api_versions, fetch_broker_addresses
from kvproxy.protocol.errors import ProtocolError, TooManyNodes
from kvproxy.proxy.cluster.broker_directory import BrokerDirectory
from kvproxy.proxy.cluster.readiness import ClusterReadiness
from kvproxy.proxy.cluster.upstream_failures import describe_failure


class MetadataRefresh:
    """Teaches the broker directory what a bootstrap server answers, and tells readiness."""

    def __init__(
        self,
        brokers: BrokerDirectory,
        readiness: ClusterReadiness,
        *,
        upstream_ssl: ssl.SSLContext | None,
        connect_timeout_s: float,
        admin_connections: AdminConnections | None,
    ) -> None:
        self._brokers = brokers
        self._readiness = readiness
        self._upstream_ssl = upstream_ssl
        self._timeout = connect_timeout_s
        self._admin = admin_connections
        """Where the proxy's own Metadata requests go (one kept connection per address)."""

    async def refresh(self, *, strict: bool = False) -> bool:
        """Ask a bootstrap server for Metadata and learn the brokers it names; True when one
        answered.

        `strict` (at start): a node with no port raises ProxyError, so `serve` refuses to run
        rather than serve part of the cluster; later such a node is logged and left out.
        An answer naming more than `MAX_NODES_PER_ANSWER` brokers is a failed refresh: none
        of them is learnt, the brokers known before stay, and the reason is logged once.

        A SASL-only listener closes the connection on the proxy's Metadata request (it carries
        no credentials) but answers ApiVersions, which Kafka serves before authentication: such
        a cluster has answered too, and its brokers are learnt from clients' answers."""
        problems = []
        for host, port in self._brokers.bootstrap_servers:
            try:
                nodes = await fetch_broker_addresses(
                    host, port, self._upstream_ssl, self._timeout, connections=self._admin
                )
            except (OSError, TimeoutError, ProtocolError) as exc:
                why = describe_failure(exc, self._timeout)
                if isinstance(exc, TooManyNodes):
                    why += "; the brokers learnt before are kept"
                if isinstance(exc, ConnectionError) and await answers_api_versions(
                    host, port, self._upstream_ssl, self._timeout
                ):
                    self._readiness.answered(
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
                    await self._brokers.learn_node(node_id, address)
                else:
                    await self._brokers.learn_node_or_log(node_id, address)
            self._readiness.answered(
                f"the cluster answered: {len(nodes)} broker(s) at {host}:{port}"
            )
            return True
        self._readiness.failed("; ".join(problems))
        return False
