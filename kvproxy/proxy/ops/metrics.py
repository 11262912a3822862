"""Prometheus metrics, and the small HTTP endpoint that serves them with /healthz and /readyz.

Each `ProxyServer` has its own registry, so several proxies in one process (tests) do not share
counters. Topic labels are bounded: a topic's name is a label value only when the cluster has
the topic, and only for the first `topic_label_limit` of them (`_other` after, `_unknown` for
names the cluster does not know; `kvproxy/proxy/ops/topic_labels.py`), so a client cannot blow up
the metric
cardinality by inventing topics.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from kio.schema.index import api_key_map
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvproxy.protocol.api_table import api_label
from kvproxy.proxy.ops.accepted_counts import AcceptedCounts
from kvproxy.proxy.ops.metric_tallies import CounterTally, HistogramTally, TallyFlush
from kvproxy.proxy.ops.topic_labels import OTHER_TOPICS, UNKNOWN_TOPICS, TopicLabels
from kvproxy.registry.catalog import CatalogObserver

__all__ = ["OTHER_TOPICS", "UNKNOWN_TOPICS", "ProxyMetrics", "start_http_endpoint"]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_REGISTRY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_LATENCY_BUCKETS: Final = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip
_MAX_HTTP_REQUEST: Final = 8192
LABEL_FLUSH_TIMEOUT_S: Final = 5.0
MAX_NODE_LABELS: Final = 1_000
"""Distinct node ids a metric labels by; connections to further nodes count under "other"."""
"""How long /metrics waits for the cluster's answer about topics counted just before."""


def api_name(api_key: int) -> str:
    """A bounded label for an api key: Kafka's name (snake case, as kio spells it), or
    `unknown` for one newer than the proxy's table."""
    known = api_key_map.get(api_key)
    if known is not None:
        return known
    label = api_label(api_key)
    return label if label == "unknown" else re.sub(r"(?<!^)(?=[A-Z])", "_", label).lower()


class _CrashCollector(Collector):
    """Policy crashes, read from the live routing at scrape time (it survives reloads)."""

    def __init__(self, source: Callable[[], dict[str, int]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "kvproxy_policy_crashes",
            "Policies that raised something other than PolicyViolation (the partition was "
            "rejected: fail closed)",
            labels=["policy"],
        )
        for policy, count in sorted(self._source().items()):
            family.add_metric([policy], count)
        yield family


class _JournalCollector(Collector):
    """The quarantine journal's health, read at scrape time."""

    def __init__(self, source: Callable[[], Any]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        journal = self._source()
        if journal is None:
            return
        written = CounterMetricFamily(
            "kvproxy_quarantine_entries", "Quarantine journal entries by result", labels=["result"]
        )
        written.add_metric(["written"], journal.written)
        written.add_metric(["failed"], journal.failed_writes)
        written.add_metric(["dropped"], journal.dropped)
        yield written
        dropped = CounterMetricFamily(
            "kvproxy_quarantine_dropped", "Journal entries not kept, by reason", labels=["reason"]
        )
        dropped_bytes = CounterMetricFamily(
            "kvproxy_quarantine_dropped_bytes", "Bytes of those entries", labels=["reason"]
        )
        for reason, (entries, size) in sorted(journal.dropped_by_reason.items()):
            dropped.add_metric([reason], entries)
            dropped_bytes.add_metric([reason], size)
        yield dropped
        yield dropped_bytes
        yield GaugeMetricFamily(
            "kvproxy_quarantine_queued_bytes",
            "Bytes waiting to be journaled",
            value=journal.queued_bytes,
        )
        yield GaugeMetricFamily(
            "kvproxy_quarantine_degraded",
            "1 while the quarantine journal cannot be written (clients are still answered)",
            value=1 if journal.degraded else 0,
        )


class _ShownOnceCounted(Collector):
    """A counter served only once it counted something: a fresh /metrics stays small."""

    def __init__(self, name: str, documentation: str) -> None:
        self._name = name
        self._documentation = documentation
        self.value = 0

    def inc(self) -> None:
        self.value += 1

    def collect(self) -> Iterator[Metric]:
        if self.value:
            yield CounterMetricFamily(self._name, self._documentation, value=self.value)


@dataclass(frozen=True, slots=True)
class _MetricRow:
    """One prometheus_client metric of `ProxyMetrics`: its attribute, kind, name, help, labels."""

    attr: str
    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    """A histogram's buckets (every histogram here names its own)."""
    tallied: bool = False
    """The attribute holds a `HistogramTally` of the histogram (observed on the event loop)."""

    def __post_init__(self) -> None:
        if (self.buckets is not None or self.tallied) != (self.kind is Histogram):
            raise TypeError(f"{self.attr}: buckets (and tallied) go with a Histogram only")

    def create(self, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
        if self.buckets is None:
            return self.kind(self.name, self.help, self.labels, registry=registry)
        return Histogram(self.name, self.help, self.labels, buckets=self.buckets, registry=registry)


_C, _G, _H = Counter, Gauge, Histogram
_RELAY_METRICS: Final = (
    _MetricRow("requests", _C, "kvproxy_requests",
               "Requests from clients by API and what the proxy did with them", ("api", "outcome")),
    _MetricRow("batches", _C, "kvproxy_produce_batches",
               "Produced record batches by topic and verdict (accepted, rejected, warned)",
               ("topic", "outcome")),
    _MetricRow("records", _C, "kvproxy_produce_records",
               "Produced records by topic and verdict (accepted, rejected, warned)",
               ("topic", "outcome")),
    _MetricRow("rejections", _C, "kvproxy_policy_rejections",
               "Partitions rejected (or, in warn mode, that would have been) by topic, policy, "
               "code",
               ("topic", "policy", "code")),
    _MetricRow("bytes", _C, "kvproxy_bytes",
               "Bytes moved, by direction (client_in, client_out, upstream_in, upstream_out)",
               ("direction",)),
    _MetricRow("proxy_latency", _H, "kvproxy_produce_proxy_latency_seconds",
               "Time the proxy adds to a Produce request before forwarding or answering it",
               buckets=_LATENCY_BUCKETS, tallied=True),
    _MetricRow("upstream_latency", _H, "kvproxy_produce_upstream_latency_seconds",
               "Time from forwarding a Produce request to the broker's answer",
               buckets=_LATENCY_BUCKETS, tallied=True),
    _MetricRow("client_connections", _G, "kvproxy_client_connections", "Open client connections"),
    _MetricRow("client_connections_accepted", _C, "kvproxy_client_connections_accepted",
               "Client connections accepted (TLS: once the handshake is done), by listener "
               "(bootstrap, broker, sni) and node (bootstrap or the node id; 'other' beyond "
               f"{MAX_NODE_LABELS} node ids)",
               ("listener", "node")),
    _MetricRow("upstream_connections", _G, "kvproxy_upstream_connections",
               "Open connections to brokers"),
    _MetricRow("connect_failures", _C, "kvproxy_upstream_connect_failures",
               "Failed attempts to connect to a broker", ("upstream",)),
    _MetricRow("tls_handshake_failures", _C, "kvproxy_tls_handshake_failures",
               "Failed TLS handshakes of clients, by listener (bootstrap, broker, sni) and reason",
               ("listener", "reason")),
    _MetricRow("reloads", _C, "kvproxy_config_reloads", "Configuration reloads by result",
               ("result",)),
    _MetricRow("closed", _C, "kvproxy_connections_closed",
               "Client connections the proxy closed, by reason", ("reason",)),
    _MetricRow("dead_letters", _C, "kvproxy_dead_letters",
               "Dead-letter copies of rejected batches, by result", ("result",)),
)  # fmt: skip
"""What the proxy relays, its connections and its refusals, in /metrics order."""
_HEALTH_METRICS: Final = (
    _MetricRow("ready", _G, "kvproxy_ready",
               "1 once the cluster has answered the proxy and while a bootstrap server accepts "
               "connections"),
    _MetricRow("unmapped_nodes", _G, "kvproxy_unmapped_nodes",
               "Broker nodes named by the cluster that have no proxy port (left out of answers)"),
    _MetricRow("loop_lag", _H, "kvproxy_event_loop_lag_seconds",
               "How late the event loop ran a timer due every 100 ms: how long it was held",
               buckets=_LAG_BUCKETS),
    _MetricRow("loop_lag_max", _G, "kvproxy_event_loop_lag_max_seconds",
               "The longest the event loop was held in the last minute"),
    _MetricRow("decode_memory", _G, "kvproxy_decode_memory_bytes",
               "Memory held by decoding Produce requests now (limits.decode_memory_bytes)"),
    _MetricRow("decode_budget_refusals", _C, "kvproxy_decode_budget_refusals",
               "Partitions answered MESSAGE_TOO_LARGE because decoding them would pass a memory "
               "limit"),
    _MetricRow("receive_memory", _G, "kvproxy_receive_memory_bytes",
               "Bytes reserved by client requests being received (limits.receive_buffer_bytes)"),
    _MetricRow("receive_waits", _C, "kvproxy_receive_memory_waits",
               "Times a client connection stopped being read until receive memory was free"),
    _MetricRow("off_loop_decisions", _C, "kvproxy_produce_off_loop",
               "Produce requests decided off the event loop (too much to decode on it)"),
    _MetricRow("decided", _C, "kvproxy_produce_decided",
               "Produce requests by the path that decided them (compiled: accepted whole by the "
               "compiled fast accept; python: the policies' own path)", ("path",)),
    _MetricRow("topic_lookups", _C, "kvproxy_topic_settings_lookups",
               "New topic names described (asked) or not (client_rate, pending)", ("outcome",)),
    _MetricRow("schema_lookups", _C, "kvproxy_schema_lookups",
               "Schema ids looked up in the registry, by outcome (found, unknown, unavailable, "
               "abandoned: nobody waited any more, wait_expired: a request stopped waiting)",
               ("outcome",)),
    _MetricRow("schema_cache_hits", _C, "kvproxy_schema_cache_hits",
               "Schema ids a partition's check found in the cache (counted once per partition)"),
    _MetricRow("schema_registry_requests", _H, "kvproxy_schema_registry_request_seconds",
               "HTTP requests to the schema registry and their time, by outcome (ok, not_found, "
               "error, timeout, unreachable, too_large)",
               ("outcome",), buckets=_REGISTRY_BUCKETS),
)  # fmt: skip
"""Readiness, the event loop, memory and the lookups, in /metrics order (after the collector of
repeated refusals, registered between the two tables)."""


class ProxyMetrics:
    """The proxy's metrics: the two tables above, in their order, plus what does not fit them."""

    # The tables' attributes, declared so that their types are known (`_create` sets them). The
    # `bytes` among them hides the builtin in this class: `builtins.bytes` below.
    requests: Counter
    batches: Counter
    records: Counter
    rejections: Counter
    bytes: Counter
    proxy_latency: HistogramTally
    upstream_latency: HistogramTally
    client_connections: Gauge
    client_connections_accepted: Counter
    upstream_connections: Gauge
    connect_failures: Counter
    tls_handshake_failures: Counter
    reloads: Counter
    closed: Counter
    dead_letters: Counter
    ready: Gauge
    unmapped_nodes: Gauge
    loop_lag: Histogram
    loop_lag_max: Gauge
    decode_memory: Gauge
    decode_budget_refusals: Counter
    receive_memory: Gauge
    receive_waits: Counter
    off_loop_decisions: Counter
    decided: Counter
    topic_lookups: Counter
    schema_lookups: Counter
    schema_cache_hits: Counter
    schema_registry_requests: Histogram

    def __init__(self, topic_label_limit: int = 1000) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._tallies = TallyFlush()
        self.registry.register(self._tallies)  # first: the tallies are flushed before any read
        self._children: dict[tuple[int, tuple[str, ...]], CounterTally] = {}
        self.topic_labels = TopicLabels(topic_label_limit, self.child)
        """Counts by topic go through it: `topic_labels.count(metric, topic, (outcome,), n)`."""
        self._create(_RELAY_METRICS)
        self.repeated_refusals = _ShownOnceCounted(
            "kvproxy_quarantine_repeated_batches", "Refused batches sent again, kept once"
        )
        self.registry.register(self.repeated_refusals)
        self._create(_HEALTH_METRICS)
        self.accepted = AcceptedCounts(self)
        """Requests the compiled fast accept passed whole, counted as the Python path would."""

    def _create(self, rows: tuple[_MetricRow, ...]) -> None:
        """Make the rows' metrics in their order: the registry's order is the exposition's."""
        for row in rows:
            metric = row.create(self.registry)
            if row.tallied and isinstance(metric, Histogram):
                setattr(self, row.attr, self._tally(metric))
            else:
                setattr(self, row.attr, metric)

    def registry_observer(self) -> CatalogObserver:
        """What the schema catalog reports, into these metrics (straight into prometheus_client,
        whose children take a lock: the catalog may be used off the event loop)."""
        lookups, requests = self.schema_lookups, self.schema_registry_requests
        return CatalogObserver(
            lookup=lambda outcome: lookups.labels(outcome).inc(),
            cache_hit=self.schema_cache_hits.inc,
            request=lambda outcome, seconds: requests.labels(outcome).observe(seconds),
        )

    def watch_policy_crashes(self, source: Callable[[], dict[str, int]]) -> None:
        self.registry.register(_CrashCollector(source))

    def watch_journal(self, source: Callable[[], Any]) -> None:
        self.registry.register(_JournalCollector(source))

    def child(self, metric: Counter, *values: str) -> CounterTally:
        """A lock-free tally of `metric.labels(*values)`, for the event loop only (see
        `kvproxy/proxy/ops/metric_tallies.py`), looked up once: `labels()` takes a lock and builds
        its key."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = CounterTally(metric.labels(*values))
            self._tallies.tallies.append(found)
        return found

    def _tally(self, histogram: Histogram) -> HistogramTally:
        tally = HistogramTally(histogram)
        self._tallies.tallies.append(tally)
        return tally

    def exposition(self) -> builtins.bytes:
        """/metrics as it is now (counts whose topic the cluster has not answered for are not
        in it yet; `render` waits for those)."""
        return generate_latest(self.registry)

    async def render(self) -> builtins.bytes:
        """/metrics once the answers pending about topics counted before are in (at most
        `LABEL_FLUSH_TIMEOUT_S`)."""
        await self.topic_labels.flush(LABEL_FLUSH_TIMEOUT_S)
        return self.exposition()


ReadyCheck = Callable[[], Awaitable[tuple[bool, str]]]
Exposition = Callable[[], Awaitable[bytes]]
"""Renders /metrics (async: the supervisor of several workers gathers theirs)."""


async def start_http_endpoint(
    host: str, port: int, metrics: ProxyMetrics | Exposition, ready: ReadyCheck
) -> asyncio.Server:
    """Serve GET /metrics, /healthz and /readyz (HTTP/1.0-style: one request per connection)."""
    render: Exposition
    if isinstance(metrics, ProxyMetrics):
        registry = metrics
        render = registry.render

        def readiness_seen(is_ready: bool) -> None:
            registry.ready.set(1 if is_ready else 0)

    else:
        render = metrics

        def readiness_seen(is_ready: bool) -> None:
            return None

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            method, path = _request_line(head)
            status, body, content_type = await _route(method, path, render, ready, readiness_seen)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            status, body, content_type = 400, b"bad request\n", "text/plain"
        except ConnectionError:
            writer.close()
            return
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  503: "Service Unavailable"}[status]  # fmt: skip
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, host, port, limit=_MAX_HTTP_REQUEST)


def _request_line(head: bytes) -> tuple[str, str]:
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    method, target, _version = line.split(" ", 2)
    return method, target.split("?", 1)[0]


async def _route(
    method: str,
    path: str,
    render: Exposition,
    ready: ReadyCheck,
    readiness_seen: Callable[[bool], None],
) -> tuple[int, bytes, str]:
    if method not in ("GET", "HEAD"):
        return 405, b"only GET\n", "text/plain"
    if path == "/metrics":
        return 200, await render(), CONTENT_TYPE
    if path == "/healthz":
        return 200, b"ok\n", "text/plain"
    if path == "/readyz":
        is_ready, why = await ready()
        readiness_seen(is_ready)
        return (200 if is_ready else 503), (why + "\n").encode(), "text/plain"
    return 404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain"
