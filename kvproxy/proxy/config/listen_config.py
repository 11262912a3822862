"""The `listen` section: where clients connect (the bootstrap and a port per broker, and the SNI
listener), and how node ids map to ports.

Part of the proxy's configuration (`kvproxy.proxy.config.proxy_config`), in a module of its own for
its size.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from kvproxy.proxy.config.sni_names import (
    MAX_NODE_ID,
    NODE_ID,
    SniNames,
    dns_name_problem,
    normal_name,
)
from kvproxy.settings.loading import Section
from kvproxy.settings.secrets import Secret


class NodePortError(ValueError):
    """A broker node has no listener port under the configured mapping."""


def shared_port_problem(owner: int, node_id: int, port: int, max_brokers: int) -> str:
    """Why `node_id` gets no port: `owner` holds it (ids equal modulo `max_brokers`)."""
    return (
        f"node {node_id} has no port: port {port} is node {owner}'s (node ids {owner} and "
        f"{node_id} are equal modulo max_brokers {max_brokers}); set listen.lowest_node_id "
        "and listen.max_brokers so that every node id fits"
    )


class ListenerTls(Section):
    """TLS for client connections: the proxy's certificate chain and key (PEM)."""

    cert_file: Path
    key_file: Path
    key_password: Secret | None = None
    """Password of an encrypted `key_file`; `${NAME}` reads it from the environment."""
    client_ca_file: Path | None = None
    """When set, clients must present a certificate signed by this CA, valid (not expired) at
    the time of the handshake (mutual TLS); when unset, client certificates are not asked for."""


class ListenSni(Section):
    """One TLS port for the bootstrap and every broker: the server name a client sends (SNI)
    chooses which (`kvproxy.proxy.config.sni_names`)."""

    host: str | None = None
    """The address to bind; default `listen.host`."""
    port: int = Field(ge=0, le=65535)
    advertised_port: int | None = Field(default=None, ge=1, le=65535)
    """The port answers to clients name (a load balancer's or an ingress's, e.g. 443); default
    `port`."""
    bootstrap: str
    """The bootstrap's server name."""
    brokers: str
    """A broker's server name, with one `$(nodeId)`: "broker-$(nodeId).kafka.example.com"."""
    without_sni: Literal["refuse", "bootstrap"] = "refuse"
    """A client that sends no server name: refused with a TLS alert, or served the bootstrap."""
    tls: ListenerTls | None = None
    """Default `listen.tls`; one of the two is required."""

    @field_validator("bootstrap")
    @classmethod
    def _bootstrap_name(cls, name: str) -> str:
        name = normal_name(name)
        problem = dns_name_problem(name)
        if problem is not None:
            raise ValueError(f"{name!r} is not a DNS name: it {problem}")
        return name

    @field_validator("brokers")
    @classmethod
    def _brokers_pattern(cls, pattern: str) -> str:
        pattern = NODE_ID.join(normal_name(part) for part in pattern.split(NODE_ID))
        if pattern.count(NODE_ID) != 1:
            raise ValueError(
                f"{pattern!r} must hold {NODE_ID} exactly once (where the node id goes)"
            )
        problem = dns_name_problem(pattern.replace(NODE_ID, str(MAX_NODE_ID)))
        if problem is not None:
            raise ValueError(f"{pattern!r} does not make DNS names: with a node id it {problem}")
        return pattern

    @model_validator(mode="after")
    def _names_apart(self) -> ListenSni:
        if self.names.broker_of(self.bootstrap) is not None:
            raise ValueError(
                f"bootstrap {self.bootstrap!r} matches the brokers pattern {self.brokers!r}: "
                "it would name a broker"
            )
        return self

    @property
    def names(self) -> SniNames:
        return SniNames(self.bootstrap, self.brokers)


class ListenConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(default=9192, ge=0, le=65535)
    advertised_host: str | None = None
    broker_port_base: int = Field(default=9193, ge=0, le=65535)
    lowest_node_id: int | None = Field(default=None, ge=0)
    """Unset (the default): node N listens on `broker_port_base + N mod max_brokers`, which needs
    no knowledge of the cluster and is the same in every process and after every restart; it
    serves any cluster whose node ids differ modulo `max_brokers` (0-99, 1001-1003, 1-3, ...).
    Set: node N listens on `broker_port_base + N - lowest_node_id`, and a node id outside
    `[lowest_node_id, lowest_node_id + max_brokers)` has no port."""
    max_brokers: int = Field(default=100, ge=1, le=10000)
    tls: ListenerTls | None = None
    port_per_broker: bool = True
    """The bootstrap port and a port per broker; false: only the SNI listener (`sni`)."""
    sni: ListenSni | None = None

    @property
    def sni_tls(self) -> ListenerTls | None:
        """The SNI listener's TLS: its own, or the port-per-broker listeners'."""
        if self.sni is None:
            return None
        return self.sni.tls or self.tls

    @property
    def public_host(self) -> str:
        """The host clients are told to connect to."""
        return self.advertised_host or self.host

    @property
    def port_rule(self) -> str:
        """How node ids map to ports, in words (for `kvproxy check` and errors)."""
        first, last = self.broker_port_base, self.broker_port_base + self.max_brokers - 1
        if self.lowest_node_id is None:
            return f"node N -> port {first} + (N mod {self.max_brokers}), ports {first}-{last}"
        return f"node N -> port {first} + (N - {self.lowest_node_id}), ports {first}-{last}"

    def broker_port(self, node_id: int) -> int:
        """The listener port of node `node_id`; NodePortError when the mapping gives it none."""
        if self.lowest_node_id is None:
            return self.broker_port_base + node_id % self.max_brokers
        index = node_id - self.lowest_node_id
        if not 0 <= index < self.max_brokers:
            raise NodePortError(
                f"node id {node_id} is outside the proxy's broker port range "
                f"(lowest_node_id {self.lowest_node_id}, max_brokers {self.max_brokers}): "
                "leave listen.lowest_node_id unset, or set it and listen.max_brokers so that "
                "every node id of the cluster fits"
            )
        return self.broker_port_base + index

    def port_or_none(self, node_id: int) -> int | None:
        """As `broker_port`, None (no exception) when the mapping gives the node no port."""
        if self.lowest_node_id is None:
            return self.broker_port_base + node_id % self.max_brokers
        index = node_id - self.lowest_node_id
        return self.broker_port_base + index if 0 <= index < self.max_brokers else None

    def plan_ports(self, node_ids: Iterable[int]) -> tuple[dict[int, int], list[str]]:
        """node id -> port for every node that gets one, and why the others do not (a port
        taken by a node that came earlier in `node_ids`, or no port at all)."""
        ports: dict[int, int] = {}
        owners: dict[int, int] = {}
        problems: list[str] = []
        for node_id in node_ids:
            try:
                port = self.broker_port(node_id)
            except NodePortError as exc:
                problems.append(str(exc))
                continue
            owner = owners.setdefault(port, node_id)
            if owner != node_id:
                problems.append(shared_port_problem(owner, node_id, port, self.max_brokers))
                continue
            ports[node_id] = port
        return ports, problems

    @model_validator(mode="after")
    def _ports_fit(self) -> ListenConfig:
        if self.broker_port_base and self.broker_port_base + self.max_brokers - 1 > 65535:
            raise ValueError(
                f"broker_port_base {self.broker_port_base} + max_brokers {self.max_brokers} "
                "runs past port 65535"
            )
        if (
            self.port
            and self.broker_port_base <= self.port < self.broker_port_base + self.max_brokers
        ):
            raise ValueError(
                f"port {self.port} falls inside the broker port range starting at "
                f"{self.broker_port_base}"
            )
        self._sni_fits()
        return self

    def _sni_fits(self) -> None:
        if self.sni is None:
            if not self.port_per_broker:
                raise ValueError(
                    "port_per_broker: false needs sni: without either, no client could connect"
                )
            return
        if self.sni_tls is None:
            raise ValueError(
                "sni needs TLS (the server name is read from the TLS handshake): set sni.tls "
                "or listen.tls"
            )
        port = self.sni.port
        if not self.port_per_broker or not port:
            return
        if port == self.port:
            raise ValueError(f"sni.port {port} is the bootstrap's port (listen.port)")
        if self.broker_port_base <= port < self.broker_port_base + self.max_brokers:
            raise ValueError(
                f"sni.port {port} falls inside the broker port range starting at "
                f"{self.broker_port_base}"
            )
