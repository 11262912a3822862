"""What `kvproxy serve --workers N` relies on outside its processes: one /metrics page made of
every worker's metrics, journals kept per worker (`worker-<i>/`) and read back by the quarantine
reader and the audit, and log lines that name their worker."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from kvproxy.journal import WORKER_DIR_PREFIX, Journal, JournalReader
from kvproxy.journal.reader import journal_directories
from kvproxy.pipeline.segments import JournalSegment, discover
from kvproxy.proxy.ops.logs import configure_logging
from kvproxy.proxy.serve.workers import merge_exposition
from tests.harness.journal_entries import entry

# ---- one /metrics page for every worker ----


def worker_exposition(
    requests: dict[str, int], connections: float, latencies: Sequence[float]
) -> str:
    """What one worker's own /metrics endpoint serves: a counter, a gauge and a histogram."""
    registry = CollectorRegistry()
    counter = Counter(
        "kvproxy_requests", "Requests from clients", ["api", "outcome"], registry=registry
    )
    for outcome, count in requests.items():
        counter.labels("produce", outcome).inc(count)
    Gauge("kvproxy_client_connections", "Open client connections", registry=registry).set(
        connections
    )
    histogram = Histogram(
        "kvproxy_produce_proxy_latency_seconds",
        "Time the proxy adds",
        buckets=(0.001, 0.01),
        registry=registry,
    )
    for seconds in latencies:
        histogram.observe(seconds)
    return generate_latest(registry).decode()


class Families(Collector):
    def __init__(self, families: Sequence[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def render(families: Sequence[Metric]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(families))
    return generate_latest(registry).decode()


def test_merged_metrics_have_one_family_per_name_with_a_worker_label_and_parse_again() -> None:
    texts = [
        (0, worker_exposition({"forwarded": 3}, 2, [0.0005, 0.005])),
        (1, worker_exposition({"forwarded": 5, "rejected": 1}, 7, [0.02])),
    ]
    page = render(merge_exposition(texts))

    def type_lines(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith("# TYPE ")]

    # the same families as one worker's page, each once (prometheus_client writes _created apart)
    assert sorted(type_lines(page)) == sorted(type_lines(texts[0][1])), page
    assert "# TYPE kvproxy_requests_total counter" in type_lines(page)

    families = list(text_string_to_metric_families(page))
    names = [family.name for family in families]
    assert len(names) == len(set(names)), f"a family is split in two: {names}\n{page}"
    types = {family.name: family.type for family in families}
    assert types["kvproxy_requests"] == "counter"
    assert types["kvproxy_client_connections"] == "gauge"
    assert types["kvproxy_produce_proxy_latency_seconds"] == "histogram"

    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families
        for sample in family.samples
    }

    def at(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    produce = {"api": "produce"}
    assert at("kvproxy_requests_total", **produce, outcome="forwarded", worker="0") == 3
    assert at("kvproxy_requests_total", **produce, outcome="forwarded", worker="1") == 5
    assert at("kvproxy_requests_total", **produce, outcome="rejected", worker="1") == 1
    assert at("kvproxy_client_connections", worker="0") == 2
    assert at("kvproxy_client_connections", worker="1") == 7
    latency = "kvproxy_produce_proxy_latency_seconds"
    assert at(f"{latency}_count", worker="0") == 2
    assert at(f"{latency}_count", worker="1") == 1
    assert at(f"{latency}_bucket", le="0.001", worker="0") == 1
    assert at(f"{latency}_bucket", le="0.01", worker="0") == 2
    assert at(f"{latency}_bucket", le="0.01", worker="1") == 0
    assert at(f"{latency}_bucket", le="+Inf", worker="1") == 1
    assert at(f"{latency}_sum", worker="1") == 0.02
    unlabelled = [key for key in samples if dict(key[1]).get("worker") not in {"0", "1"}]
    assert unlabelled == [], "every sample names its worker"


def test_merging_no_worker_gives_no_family() -> None:
    assert merge_exposition([]) == []


# ---- one journal per worker, read as one ----


def test_journal_directories_lists_the_workers_in_number_order(tmp_path: Path) -> None:
    for name in ("worker-10", "worker-2", "worker-1", "worker-x", "worker-", "other", "worker"):
        (tmp_path / name).mkdir()
    (tmp_path / "worker-3").write_text("a file, not a journal")
    assert journal_directories(tmp_path) == [
        tmp_path,
        tmp_path / "worker-1",
        tmp_path / "worker-2",
        tmp_path / "worker-10",
    ]
    assert journal_directories(tmp_path / "missing") == [tmp_path / "missing"]


def write_journal(directory: Path, entries: Sequence[int], segment_bytes: int = 64 << 20) -> None:
    journal = Journal(directory, segment_bytes=segment_bytes, flush_interval_ms=0)
    journal.open()
    try:
        for n in entries:
            journal.append(entry(n))
        assert journal.flush(timeout=10), f"{directory}: entries not written"
    finally:
        journal.close()


def test_reader_reads_its_own_journal_then_each_worker_journal_in_worker_order(
    tmp_path: Path,
) -> None:
    write_journal(tmp_path, [0])
    write_journal(tmp_path / f"{WORKER_DIR_PREFIX}10", [10, 11])
    write_journal(tmp_path / f"{WORKER_DIR_PREFIX}2", [2])
    write_journal(tmp_path / "worker-old", [99])  # not a worker's journal: not read
    assert [e.id for e in JournalReader(tmp_path).entries()] == [
        f"{n:032x}" for n in (0, 2, 10, 11)
    ]
    segments = JournalReader(tmp_path).segments()
    assert [path.parent for path in segments] == [
        tmp_path,
        tmp_path / "worker-2",
        tmp_path / "worker-10",
    ]


def test_audit_finds_the_segments_of_every_worker_journal(tmp_path: Path) -> None:
    journal = tmp_path / "quarantine"
    write_journal(journal / "worker-0", range(0, 12), segment_bytes=1024)
    write_journal(journal / "worker-1", range(100, 103), segment_bytes=1024)
    write_journal(journal / "worker-7b", [7])  # not a worker's journal
    expected = sorted(str(path) for path in journal.glob("worker-[0-9]/*.kvq"))
    assert len([p for p in expected if "/worker-0/" in p]) > 1, "worker 0 rolled its segments"
    assert any("/worker-1/" in p for p in expected)
    assert not list(journal.glob("*.kvq")), "nothing journaled outside the worker folders"

    found = discover(str(journal))
    assert all(isinstance(segment, JournalSegment) for segment in found), found
    assert sorted(segment.uri for segment in found) == expected
    assert sorted(str(path) for path in JournalReader(journal).segments()) == expected


# ---- log lines name their worker ----


def log_through(log_format: str, worker: int | None) -> list[str]:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging(log_format, stream=stream, worker=worker)  # type: ignore[arg-type]
        logging.getLogger("kvproxy").info("listening on %s", 9092, extra={"port": 9092})
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.captureWarnings(False)
    return stream.getvalue().splitlines()


def test_worker_log_lines_name_the_worker_in_text_and_json() -> None:
    (text,) = log_through("text", worker=3)
    assert text.endswith(" INFO kvproxy[worker 3]: listening on 9092"), text
    (line,) = log_through("json", worker=3)
    entry = json.loads(line)
    assert (entry["worker"], entry["message"], entry["port"]) == (3, "listening on 9092", 9092)
    (plain,) = log_through("text", worker=None)
    assert plain.endswith(" INFO kvproxy: listening on 9092") and "worker" not in plain
    assert "worker" not in json.loads(log_through("json", worker=None)[0])
