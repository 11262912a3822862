"""kvproxy's YAML configuration: loaded once, validated with clear errors, frozen.

The proxy's own sections (upstream, limits, metrics, ...) are here, `listen` in
`kvproxy.proxy.config.listen_config`; what the audit reads from the same file too (how it is read
and
reported, `errors`, the policy sections) is in `settings`. Every key has a default and unknown
keys are errors, so a typo is reported instead of ignored. The policy sections (`defaults`,
`topics`) are kept as data here and turned into policy chains by
`kvproxy.policies.config.build_routing`, which reports their errors; `load_config_and_rules`
reports the errors of both at once, each with the line of the file it is
on. `docs/configuration.md` documents every key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from kvproxy.policies.config import TopicRouting, build_routing
from kvproxy.policies.errors import PolicyConfigError
from kvproxy.policies.producer_state import ProducerStateTracker
from kvproxy.policies.topic_patterns import PatternError, compile_pattern
from kvproxy.protocol.framing import DEFAULT_MAX_FRAME_SIZE
from kvproxy.proxy.config.listen_config import ListenConfig
from kvproxy.proxy.errors import ProxyError
from kvproxy.proxy.ops.fds import default_connections_per_listener
from kvproxy.settings.addresses import parse_host_port
from kvproxy.settings.loading import Section, read_document, report, validate
from kvproxy.settings.rules import RULE_SECTIONS, RuleSections
from kvproxy.settings.schema_registry import (
    REGISTRY_MISSING,
    SchemaRegistryConfig,
    registry_missing,
)
from kvproxy.settings.secrets import Secret
from kvproxy.settings.sections import ErrorsConfig


class UpstreamTls(Section):
    """TLS to the brokers: the CA to trust and, for mutual TLS, a client certificate."""

    ca_file: Path | None = None
    """Verify brokers against this CA bundle; None: the system's trusted CAs. Brokers are always
    verified: there is no setting that accepts an untrusted or expired certificate."""
    cert_file: Path | None = None
    key_file: Path | None = None
    key_password: Secret | None = None
    """Password of an encrypted client key; `${NAME}` reads it from the environment."""
    check_hostname: bool = True
    """Check that the broker's certificate names the host the proxy connects to (the bootstrap
    server's host, or the host the cluster advertises for a node)."""


class UpstreamConfig(Section):
    bootstrap_servers: tuple[str, ...] = ()
    embedded: bool = False
    connect_timeout_ms: int = Field(default=10_000, ge=1)
    tls: UpstreamTls | None = None

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_port(cls, servers: tuple[str, ...]) -> tuple[str, ...]:
        for server in servers:
            parse_host_port(server)
        return servers

    @model_validator(mode="after")
    def _one_source(self) -> UpstreamConfig:
        if self.embedded and self.bootstrap_servers:
            raise ValueError("set either bootstrap_servers or embedded: true, not both")
        if not self.embedded and not self.bootstrap_servers:
            raise ValueError("bootstrap_servers is required (or embedded: true for development)")
        return self

    def addresses(self) -> tuple[tuple[str, int], ...]:
        return tuple(parse_host_port(server) for server in self.bootstrap_servers)


class ApisConfig(Section):
    """Which Kafka APIs clients are offered (`kvproxy.protocol.api_table`)."""

    unknown: Literal["remove", "relay"] = "remove"
    """An API, or a version of one, newer than kvproxy's table: `remove` keeps it out of
    ApiVersions (its answers might name brokers in a field kvproxy does not rewrite, sending
    clients past the proxy); `relay` offers it as the broker does and relays it unread."""


class LimitsConfig(Section):
    """What one client may cost the proxy. Every limit has a default that a well-behaved client
    never reaches, so the defaults protect the proxy without changing what clients see.

    Connection counts are per `kvproxy serve` process (each worker of `--workers N` counts its
    own), because the counts live in that process's memory.
    """

    max_frame_bytes: int = Field(default=DEFAULT_MAX_FRAME_SIZE, ge=1024)
    """Kafka's `socket.request.max.bytes` (100 MiB): a larger size prefix closes the connection
    before any of the frame is buffered."""
    max_in_flight_requests: int = Field(default=100, ge=1)
    write_buffer_high_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_connections_per_listener: int = Field(
        default_factory=default_connections_per_listener, ge=1
    )
    """Open client connections per listening port (bootstrap and each broker port; on the SNI
    listener, the bootstrap and each node). Each one holds an upstream connection, two sockets
    and their buffers (tens of KiB at rest, up to `write_buffer_high_bytes` each way), so 10,000
    stays within the memory of an ordinary host while being far above what a fleet of producers
    and consumers opens (one connection per client per broker). Unset, it is 10,000 or what the
    open file limit `serve` runs with has room for, whichever is lower
    (`fds.default_connections_per_listener`). Beyond it a new connection is closed at once,
    before the proxy opens anything upstream."""
    max_connections_per_client: int = Field(default=1_000, ge=1)
    """Open client connections from one IP address, over all listeners. One misbehaving host
    (a connection leak, a reconnect loop) should not take every slot of a listener: a tenth of the
    listener limit leaves room for nine other such hosts. Hosts behind one NAT share the count."""
    max_tls_handshakes: int = Field(default=1_000, ge=2)
    """TLS handshakes in progress at once on every TLS listener of this process. A handshake in
    progress holds a socket and the TLS session's buffers (about 60 KiB); a real client's takes
    a round trip and a few milliseconds, so even a fleet reconnecting at once stays far below.
    A connection accepted beyond it is closed at once (`too_many_handshakes`)."""
    max_tls_handshakes_per_client: int = Field(default=100, ge=1)
    """TLS handshakes in progress at once from one IP address: one host cannot take every
    handshake slot. Beyond it a new connection is closed at once (`too_many_handshakes`)."""
    tls_handshake_timeout_ms: int = Field(default=60_000, ge=10)
    """A TLS handshake not finished this long after accept is closed (reason `timeout`)."""
    tls_handshake_pressure_timeout_ms: int = Field(default=5_000, ge=10)
    """The timeout of a handshake begun while half of `max_tls_handshakes` or more are in
    progress: connections that stall their handshake give their slot back sooner, while a real
    client (a round trip and a few milliseconds) still finishes well within it."""
    idle_timeout_ms: int = Field(default=600_000, ge=10)
    """A connection with no request in flight and no bytes received for this long is closed
    (10 minutes, just above Kafka's `connections.max.idle.ms` of 9 minutes, so the broker, which
    closes first, decides as it would without the proxy). Clients reconnect when they need to."""
    request_timeout_ms: int = Field(default=30_000, ge=10)
    """A client that has sent part of a frame and then sends nothing for this long is dropped (a
    slowloris). The clock restarts with every byte received, so a large frame on a slow link is
    never cut while it is still arriving; 30 seconds is Kafka's own `request.timeout.ms`, after
    which the client has given up on the request anyway."""
    frame_receive_timeout_ms: int = Field(default=30_000, ge=10)
    """A request above 64 KiB that holds receive memory (`receive_buffer_bytes`) must arrive
    whole within this much reading time from its size prefix, however steadily its bytes come;
    otherwise the connection is closed and the memory goes to the requests waiting for it. Time
    during which the proxy holds reading to connect upstream or decide an earlier request does
    not count. 30 seconds is the clients' `request.timeout.ms` (Java, librdkafka): a request not
    sent by then has been given up on. Raise it for requests of tens of MiB over links slower
    than a few MiB/s."""
    max_records_per_request: int = Field(default=1_000_000, ge=1)
    """Records a Produce request may declare over all its batches. Checking records costs CPU per
    record, so a request declaring more is answered MESSAGE_TOO_LARGE for every partition before
    any record is decoded. An uncompressed 1 MiB request (the Java producer's `max.request.size`)
    holds at most about 150,000 records (7 bytes each at the least), and producers batch far
    fewer than that, so 1,000,000 is not reached by real traffic, while it bounds the decoding of
    one request to a fraction of a second (the record parser reads 2-5 million records a second)."""
    max_partitions_per_request: int = Field(default=10_000, ge=1)
    """Partitions a Produce request may name over all its topics (empty ones too: each costs
    work to decode, check and answer). Kafka has no such limit; a producer sends at most one
    entry per partition it produces to, led by the broker it sends to, so real requests stay
    far below 10,000. A request naming more is answered MESSAGE_TOO_LARGE for every partition
    without being decoded (acks=0: the connection is closed)."""
    receive_buffer_bytes: int = Field(default=512 * 1024 * 1024, ge=1024 * 1024)
    """Bytes the requests being received from clients may declare together, in this process
    (requests above 64 KiB; smaller ones are read in a shared 64 KiB buffer). A request reserves
    its declared size when its size prefix arrives, and its buffer grows only with the bytes that
    arrive; when the reservation does not fit, the proxy stops reading that connection until
    other requests complete (as Kafka's `queued.max.request.bytes` does). A request that has its
    reservation always completes. At least `max_frame_bytes`."""
    decode_bytes_per_request: int = Field(default=256 * 1024 * 1024, ge=1024 * 1024)
    """Memory one Produce request may hold while its records are checked: decompressed batches
    and decoded records (about 240 bytes each besides their keys and values). A partition that
    would need more is answered MESSAGE_TOO_LARGE with a message naming this limit; the others
    are checked as usual (what one partition held is given back before the next is decoded). A
    producer's batch is at most `max.request.size` (1 MiB) compressed; 256 MiB lets it expand
    more than 200 times and still be checked, as the broker would accept it."""
    decode_memory_bytes: int = Field(default=512 * 1024 * 1024, ge=1024 * 1024)
    """Memory every Produce request being checked may hold together, in this process. A
    partition that would pass it is answered NOT_ENOUGH_REPLICAS ("retry later"), never held
    waiting. With the defaults, decoding never holds more than 512 MiB, which with the rest of
    the proxy (about 100 MiB, plus receive buffers) fits a 2 GiB container."""

    @model_validator(mode="after")
    def _a_frame_fits(self) -> LimitsConfig:
        if self.receive_buffer_bytes < self.max_frame_bytes:
            raise ValueError(
                f"receive_buffer_bytes {self.receive_buffer_bytes} is below max_frame_bytes "
                f"{self.max_frame_bytes}: a request of the largest size could never be received"
            )
        return self


class ShutdownConfig(Section):
    drain_timeout_ms: int = Field(default=10_000, ge=0)


class TopicConfigsConfig(Section):
    """How long what DescribeConfigs said about a topic (`kvproxy.policies.topic_settings`) is
    trusted."""

    ttl_ms: int = Field(default=60_000, ge=0)
    absent_ttl_ms: int = Field(default=5_000, ge=0)
    """How long "the cluster cannot describe this name" is kept (a name that is no topic)."""
    max_absent_topics: int = Field(default=10_000, ge=0)
    """Such names kept at most (apart from the described topics, which they never evict)."""
    lookups_per_client_per_second: int = Field(default=10, ge=1)
    """New names one connection may have described per second, after a first
    `max_topics_per_request`; beyond, a name is decided with its settings unknown, as when
    DescribeConfigs fails."""
    lookup_requests_per_second: int = Field(default=20, ge=1)
    """The proxy's own DescribeConfigs and Metadata (topic label) requests per second; names
    asked meanwhile wait for the next request, which carries up to `max_topics_per_request`."""
    max_topics_per_request: int = Field(default=100, ge=1)
    max_pending_topics: int = Field(default=1_000, ge=1)
    """Names waiting for a DescribeConfigs answer; a name beyond them is not asked about."""


class QuarantineConfig(Section):
    """Where rejected batches are kept (a journal of segments), and dead-letter topics."""

    dir: Path | None = None
    """The journal's folder; None keeps nothing. Relative paths resolve against the config file."""
    segment_bytes: int = Field(default=64 * 1024 * 1024, ge=4096)
    retention_bytes: int = Field(default=1024 * 1024 * 1024, ge=4096)
    retention_ms: int = Field(default=7 * 24 * 3600 * 1000, ge=1)
    flush_interval_ms: int = Field(default=1000, ge=1)
    queue_bytes: int = Field(default=64 * 1024 * 1024, ge=4096)
    """Bytes of entries waiting to be written; beyond, entries are dropped, counted
    (kvproxy_quarantine_dropped_total) and reported once per `drop_report_interval_ms`."""
    drop_report_interval_ms: int = Field(default=10_000, ge=1)
    repeat_window_ms: int = Field(default=300_000, ge=0)
    """A refused batch sent again with the same bytes within this window is kept (journal, dead
    letter, log line) once and counted; 0 keeps every attempt."""
    repeat_batches: int = Field(default=10_000, ge=1)
    """Recent refused batches remembered (by digest) to recognise a repeat."""
    dead_letter_pending_bytes: int = Field(default=64 * 1024 * 1024, ge=4096)
    """Bytes of dead letters being built or sent; beyond, a dead letter is not sent (counted
    kvproxy_dead_letters_total{result="dropped"}, said once per `drop_report_interval_ms`)."""
    dead_letter_suffix: str | None = None
    """When set, rejected records are also produced to `<topic><suffix>` on the cluster."""
    dead_letter_topics: tuple[str, ...] = ("*",)
    """Which topics get a dead-letter copy: exact names, globs or /regex/."""

    @field_validator("dead_letter_topics")
    @classmethod
    def _patterns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            try:
                compile_pattern(pattern)
            except PatternError as exc:
                raise ValueError(str(exc)) from None
        return patterns

    @field_validator("dead_letter_suffix")
    @classmethod
    def _non_empty(cls, suffix: str | None) -> str | None:
        if suffix is not None and not suffix:
            raise ValueError("must not be empty (it would name the topic itself)")
        return suffix


class LogsConfig(Section):
    """How often rejections are logged: at most `rejections_per_window` lines per (topic, policy,
    code) and `rejection_lines_per_window` lines in all per window; the rest are summed up in
    one line when the window ends."""

    rejections_per_window: int = Field(default=10, ge=1)
    rejection_lines_per_window: int = Field(default=100, ge=1)
    rejection_window_ms: int = Field(default=60_000, ge=1)


class MetricsConfig(Section):
    """Prometheus metrics and health endpoints (/metrics, /healthz, /readyz) on one HTTP port."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=9404, ge=0, le=65535)
    topic_label_limit: int = Field(default=1000, ge=1)


class ProxyConfig(Section):
    listen: ListenConfig = ListenConfig()
    upstream: UpstreamConfig
    apis: ApisConfig = ApisConfig()
    limits: LimitsConfig = Field(default_factory=LimitsConfig)  # its defaults read the process
    shutdown: ShutdownConfig = ShutdownConfig()
    errors: ErrorsConfig = ErrorsConfig()
    reject: Literal["partition", "request"] = "partition"
    defaults: dict[str, Any] | None = None
    topics: tuple[dict[str, Any], ...] = ()
    topic_configs: TopicConfigsConfig = TopicConfigsConfig()
    metrics: MetricsConfig = MetricsConfig()
    quarantine: QuarantineConfig = QuarantineConfig()
    logs: LogsConfig = LogsConfig()
    schema_registry: SchemaRegistryConfig | None = None

    @field_validator("topics", mode="before")
    @classmethod
    def _no_topics(cls, value: Any) -> Any:
        """`topics:` with every entry commented out means no topic rules, as for `defaults:`."""
        return () if value is None else value


RELOADABLE_SECTIONS: tuple[str, ...] = ("errors", "reject", "defaults", "topics", "topic_configs")
"""The `ProxyConfig` sections a reload applies to a running proxy (`ProxyServer.replace_rules`);
a change to any other section takes effect at the next start only."""


def parse_config(data: Mapping[str, Any] | None, source: str = "config") -> ProxyConfig:
    config, problems = validate(ProxyConfig, data)
    if config is None:
        raise report(source, problems, {})
    return config


def load_config(path: str | Path) -> ProxyConfig:
    """The file's configuration; the policy sections are not built (see load_config_and_rules)."""
    path = Path(path)
    data, lines = read_document(path)
    config, problems = validate(ProxyConfig, data)
    if config is None:
        raise report(str(path), problems, lines)
    return config


def load_config_and_rules(
    path: str | Path,
    base_dir: Path | None = None,
    *,
    producer_state: ProducerStateTracker | None = None,
) -> tuple[ProxyConfig, TopicRouting]:
    """The file's configuration and its policy rules, built (custom classes imported, schema
    files read), or one ConfigError with every problem of both, so that a file is fixed in one
    round. Relative paths in policies resolve against `base_dir` (the file's folder by default);
    a reload passes the running rules' `producer_state` to keep it."""
    path = Path(path)
    data, lines = read_document(path)
    config, problems = validate(ProxyConfig, data)
    try:
        routing = RuleSections.of(data).build(
            base_dir if base_dir is not None else path.resolve().parent,
            producer_state=producer_state,
        )
    except PolicyConfigError as exc:
        # build_routing says what is wrong with `defaults` and `topics` in its own words
        problems = [p for p in problems if (*p.path, *p.at)[:1] not in RULE_SECTIONS]
        raise report(str(path), [*problems, *exc.problems], lines) from None
    if config is not None and config.schema_registry is None:
        missing = registry_missing(routing)
        if missing is not None:
            problems = [*problems, missing]
            config = None
    if config is None:
        routing.close()
        raise report(str(path), problems, lines)
    return config, routing


def build_routing_for(config: ProxyConfig, base_dir: Path) -> TopicRouting:
    """The policy chains of `config`; schema files resolve against `base_dir`."""
    try:
        routing = build_routing(config.defaults, config.topics, base_dir)
    except PolicyConfigError as exc:
        raise ProxyError(str(exc)) from None
    if config.schema_registry is None and registry_missing(routing) is not None:
        routing.close()
        raise ProxyError(REGISTRY_MISSING)
    return routing
