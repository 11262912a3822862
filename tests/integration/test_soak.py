"""Soak: `kvproxy serve` under a steady mix of good and bad records for a minute.

Eight confluent-kafka (librdkafka) producers and two consumers talk to a `kvproxy serve` process
in front of the real Tansu broker. The topics matching `soak-*` carry the `json` policy: a good
record is a JSON object and goes to the 4-partition topic `soak-...-good`, a bad record is not JSON
and goes to `soak-...-bad`. The two topics share Produce requests, so the proxy keeps forwarding
the valid partitions of a request while answering the invalid one itself. Each producer sends
100 good records a second and one bad record for every five good ones (about 48,000 good and 9,600
bad in a minute). The rate is what Tansu 0.6 sustains: at 250 a second per producer with 5 ms
linger it stops answering Produce requests for about 30 s, without the proxy as well.

What the user can rely on, and what the test checks:

* no good record fails, and every good record the producers were told was delivered is stored
  exactly once: a read of every partition through the proxy after the producers stop finds each
  once. The two live consumers, which read while the records are written, read nothing twice and
  nothing foreign; a record they miss must lie in an offset gap they saw. Such gaps happen with
  Tansu 0.6 without the proxy as well (a consumer reading while eight producers append skips a
  few records that a later read finds stored at their acknowledged offsets), so they are counted
  in the summary, not failed;
* every bad record gets a delivery error INVALID_RECORD (87), and nothing reaches the bad topic;
* the proxy's memory and file descriptors stay flat: after a 10 s warm-up its RSS grows by no
  more than 16 MiB (``RSS_GROWTH_LIMIT``); the open descriptors never exceed the baseline (proxy
  serving, quarantine journal open, no client) by more than two per client connection, and once
  the clients close, the count is back at the baseline.

``KVPROXY_SOAK_SECONDS`` changes the duration (60 s by default). The summary line (printed; run
with ``-s`` to see it) gives the figures: records good/bad, RSS min/max and descriptors min/max.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest
import yaml

from tests.harness import Broker, RawKafkaClient, create_topic, unique_topic_name
from tests.harness.proxy import free_port_range
from tests.harness.raw_client import (
    RawClientError,
    api_versions_v0_request,
    parse_api_versions_v0_response,
)
from tests.harness.tansu import free_port

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]

DURATION_S = float(os.environ.get("KVPROXY_SOAK_SECONDS", "60"))
"""How long the producers run; `KVPROXY_SOAK_SECONDS` sets a longer (or shorter) soak."""
WARM_UP_S = 10.0
PRODUCERS = 8
CONSUMERS = 2
GOOD_PARTITIONS = 4
RATE_PER_PRODUCER = 100
"""Good records per second per producer (plus one bad record for every `BAD_EVERY` good)."""
BAD_EVERY = 5
LINGER_MS = 20
SAMPLE_EVERY_S = 2.0
MIB = 1024 * 1024
RSS_GROWTH_LIMIT = 16 * MIB
"""Largest RSS growth accepted between the end of the warm-up and any later sample."""
INVALID_RECORD = 87


@dataclass
class Sample:
    at: float
    rss: int
    fds: int


@dataclass
class ProducerResult:
    good_ok: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    """value -> (partition, offset) of every good record reported delivered"""
    good_failed: list[tuple[bytes, str]] = field(default_factory=list)
    bad_codes: Counter[int] = field(default_factory=Counter)
    bad_sent: int = 0
    good_sent: int = 0
    flush_left: int = 0


def write_config(path: Path, bootstrap: str, quarantine: Path) -> int:
    """A `kvproxy serve` config on free ports with the `json` policy on `soak-*`."""
    port = free_port()
    config = {
        "listen": {
            "host": HOST,
            "port": port,
            "broker_port_base": free_port_range(20),
            "lowest_node_id": 100,  # Tansu is node 111
            "max_brokers": 20,
        },
        "upstream": {"bootstrap_servers": [bootstrap]},
        "metrics": {"port": 0},
        "quarantine": {"dir": str(quarantine)},
        "topics": [
            {
                "match": "soak-*",
                "default_policies": "drop",
                "policies": ["batch_integrity", "crc", "timestamps", "json"],
            }
        ],
    }
    path.write_text(yaml.safe_dump(config))
    return port


@contextlib.contextmanager
def kvproxy_serve(config: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`kvproxy serve -c config` as a child process; killed on exit if still running."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvproxy.cli", "serve", "-c", str(config)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


def wait_for_answer(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Until the proxy answers ApiVersions on `port` (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"kvproxy exited early with {proc.returncode}"
        with (
            contextlib.suppress(OSError, RawClientError),
            RawKafkaClient(HOST, port, connect_timeout=0.5) as client,
        ):
            answer = client.request(api_versions_v0_request(1), timeout=2)
            if parse_api_versions_v0_response(answer)[1] == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"kvproxy did not answer on port {port} within {timeout}s")


def warm_up(bootstrap: str, good_topic: str, bad_topic: str) -> None:
    """One good and one bad record: what the proxy opens once (the journal segment) is open."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    codes: dict[str, object] = {}

    def report(err: object, message: Any) -> None:
        codes[message.topic()] = err

    producer.produce(good_topic, b"{}", partition=0, on_delivery=report)
    producer.produce(bad_topic, b"{", partition=0, on_delivery=report)
    assert producer.flush(20) == 0
    assert codes[good_topic] is None and codes[bad_topic] is not None, codes


def sample(process: psutil.Process, started: float) -> Sample:
    return Sample(time.monotonic() - started, process.memory_info().rss, process.num_fds())


def produce(
    bootstrap: str,
    index: int,
    *,
    good_topic: str,
    bad_topic: str,
    until: float,
    result: ProducerResult,
) -> None:
    """Good JSON records at a steady rate, a non-JSON one every `BAD_EVERY`, until `until`."""
    from confluent_kafka import KafkaError, Message, Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": LINGER_MS,
            "enable.idempotence": False,
            "message.timeout.ms": 30_000,
            "client.id": f"soak-producer-{index}",
        }
    )

    def on_good(err: KafkaError | None, message: Message) -> None:
        value = message.value()
        assert value is not None
        if err is None:
            result.good_ok[value] = (message.partition() or 0, message.offset() or 0)
        else:
            result.good_failed.append((value, err.str()))

    def on_bad(err: KafkaError | None, message: Message) -> None:
        result.bad_codes[-1 if err is None else err.code()] += 1

    started = time.monotonic()
    n = 0
    while (now := time.monotonic()) < until:
        due = int((now - started) * RATE_PER_PRODUCER)
        while n < due:
            value = json.dumps({"producer": index, "n": n}).encode()
            producer.produce(good_topic, value, partition=n % GOOD_PARTITIONS, on_delivery=on_good)
            result.good_sent += 1
            if n % BAD_EVERY == 0:
                bad = f"not json {index}-{n}".encode()
                producer.produce(bad_topic, bad, partition=0, on_delivery=on_bad)
                result.bad_sent += 1
            n += 1
        producer.poll(0.01)
    result.flush_left = producer.flush(30)


@dataclass
class ConsumerResult:
    got: Counter[bytes] = field(default_factory=Counter)
    gaps: list[tuple[int, int, int]] = field(default_factory=list)
    """(partition, expected offset, offset read) wherever the offsets read were not contiguous"""
    errors: list[str] = field(default_factory=list)


def consume(
    bootstrap: str, topic: str, partitions: list[int], stop: threading.Event, result: ConsumerResult
) -> None:
    """Read `partitions` of `topic` from offset 0 (assign, no group) until `stop` is set."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "soak-unused",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "check.crcs": True,
        }
    )
    expected = dict.fromkeys(partitions, 0)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        while not stop.is_set():
            for message in consumer.consume(500, 0.2):
                error = message.error()
                if error is not None:
                    result.errors.append(error.str())
                    continue
                value = message.value()
                assert value is not None
                partition, offset = message.partition() or 0, message.offset() or 0
                if offset != expected[partition]:
                    result.gaps.append((partition, expected[partition], offset))
                expected[partition] = offset + 1
                result.got[value] += 1
    finally:
        consumer.close()


def high_watermark(bootstrap: str, topic: str, partition: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-unused"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)[1])
    finally:
        consumer.close()


def read_partition(
    bootstrap: str, topic: str, partition: int, timeout: float = 30
) -> dict[int, bytes]:
    """offset -> value of every record of `topic`-`partition`, up to its end (assign)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "soak-unused",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    stored: dict[int, bytes] = {}
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == -191:  # _PARTITION_EOF
                    break
                continue
            stored[message.offset() or 0] = message.value() or b""
    finally:
        consumer.close()
    return stored


def explain_missing(
    direct: str, topic: str, acks: dict[bytes, tuple[int, int]], missing: set[bytes]
) -> str:
    """Where each missing record should be (its acknowledged offset), read from the broker
    itself, not through the proxy."""
    lines = []
    positions = Counter(acks.values())
    partitions = {acks[v][0] for v in missing}
    stored = {p: read_partition(direct, topic, p) for p in partitions}
    for value in sorted(missing)[:10]:
        partition, offset = acks[value]
        found = [o for o, v in stored[partition].items() if v == value]
        lines.append(
            f"{value!r}: acknowledged at {partition}/{offset} "
            f"(acknowledged {positions[(partition, offset)]} times), broker holds "
            f"{stored[partition].get(offset)!r} there, found at offsets {found}, "
            f"partition has {len(stored[partition])} records"
        )
    return "\n".join(lines)


def mib(n: float) -> str:
    return f"{n / MIB:.1f}"


@pytest.mark.timeout(240)
def test_soak_good_and_bad_records_through_kvproxy_serve(tansu: Broker, tmp_path: Path) -> None:
    prefix = unique_topic_name("soak")
    good_topic = create_topic(tansu.bootstrap, f"{prefix}-good", GOOD_PARTITIONS)
    bad_topic = create_topic(tansu.bootstrap, f"{prefix}-bad", 1)
    config = tmp_path / "kvproxy.yaml"
    port = write_config(config, tansu.bootstrap, tmp_path / "quarantine")
    bootstrap = f"{HOST}:{port}"

    with kvproxy_serve(config, tmp_path / "kvproxy.log") as proc:
        wait_for_answer(port, proc)
        warm_up(bootstrap, good_topic, bad_topic)  # the journal's segment is opened, for one
        process = psutil.Process(proc.pid)
        time.sleep(1.5)  # the readiness probe's first rounds, the journal opened
        started = time.monotonic()
        baseline = sample(process, started)
        samples = [baseline]
        stop_sampling = threading.Event()

        def sampler() -> None:
            while not stop_sampling.wait(SAMPLE_EVERY_S):
                with contextlib.suppress(psutil.Error):
                    samples.append(sample(process, started))

        results = [ProducerResult() for _ in range(PRODUCERS)]
        consumed = [ConsumerResult() for _ in range(CONSUMERS)]
        stop_consumers = threading.Event()
        until = time.monotonic() + DURATION_S
        split = [list(range(GOOD_PARTITIONS))[c::CONSUMERS] for c in range(CONSUMERS)]
        threads = [threading.Thread(target=sampler, daemon=True)]
        threads += [
            threading.Thread(
                target=consume,
                args=(bootstrap, good_topic, split[c], stop_consumers, consumed[c]),
                daemon=True,
            )
            for c in range(CONSUMERS)
        ]
        producers = [
            threading.Thread(
                target=produce,
                args=(bootstrap, i),
                kwargs={
                    "good_topic": good_topic,
                    "bad_topic": bad_topic,
                    "until": until,
                    "result": results[i],
                },
                daemon=True,
            )
            for i in range(PRODUCERS)
        ]
        try:
            for thread in threads + producers:
                thread.start()
            for thread in producers:
                thread.join(DURATION_S + 60)
                assert not thread.is_alive(), "a producer did not finish"
            acks = {v: at for r in results for v, at in r.good_ok.items()}
            delivered = set(acks)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                total = sum(sum(c.got.values()) for c in consumed)
                if total >= len(delivered):
                    break
                time.sleep(0.2)
            time.sleep(1.0)  # anything extra (a duplicate) would show up now
        finally:
            stop_consumers.set()
            for thread in threads[1:]:
                thread.join(30)
        bad_stored = high_watermark(bootstrap, bad_topic, 0)
        final: Counter[bytes] = Counter()  # every partition again, now that nothing is written
        for partition in range(GOOD_PARTITIONS):
            final.update(read_partition(bootstrap, good_topic, partition).values())
        final.pop(b"{}", None)  # the warm-up record

        # every client is gone: the descriptors come back to the baseline (bounded wait)
        deadline = time.monotonic() + 15
        after = sample(process, started)
        while after.fds > baseline.fds and time.monotonic() < deadline:
            time.sleep(0.5)
            after = sample(process, started)
        stop_sampling.set()
        threads[0].join(10)
        samples.append(after)
        assert proc.poll() is None, "kvproxy exited during the soak"

    read: Counter[bytes] = sum((c.got for c in consumed), Counter())
    read.pop(b"{}", None)  # the warm-up record
    good_sent = sum(r.good_sent for r in results)
    bad_sent = sum(r.bad_sent for r in results)
    bad_codes: Counter[int] = sum((r.bad_codes for r in results), Counter())
    good_failed = [f for r in results for f in r.good_failed]
    gaps = [g for c in consumed for g in c.gaps]
    consumer_errors = [e for c in consumed for e in c.errors]
    warm = [s for s in samples if s.at >= WARM_UP_S]
    rss_at_warm = warm[0].rss
    rss = [s.rss for s in samples]
    fds = [s.fds for s in samples]
    print(
        f"\nsoak {DURATION_S:.0f} s, {PRODUCERS} producers, {CONSUMERS} consumers: "
        f"good {good_sent} sent, {len(delivered)} delivered, {len(final)} read back "
        f"({sum(final.values()) - len(final)} duplicates; the live consumers read {len(read)}, "
        f"{len(gaps)} offset gaps); bad {bad_sent} sent, "
        f"{bad_codes[INVALID_RECORD]} rejected INVALID_RECORD, {bad_stored} stored; "
        f"proxy RSS {mib(min(rss))}-{mib(max(rss))} MiB "
        f"(after warm-up {mib(rss_at_warm)}-{mib(max(s.rss for s in warm))} MiB); "
        f"fds {min(fds)}-{max(fds)} (baseline {baseline.fds}, after close {after.fds}); "
        f"{len(samples)} samples; consumer errors {consumer_errors[:3]}"
    )

    assert all(r.flush_left == 0 for r in results), "deliveries left unreported"
    assert good_failed == [], f"{len(good_failed)} good records failed: {good_failed[:5]}"
    assert len(delivered) == good_sent
    missing = delivered - set(final)
    assert not missing, f"{len(missing)} delivered records not read back:\n" + explain_missing(
        tansu.bootstrap, good_topic, acks, missing
    )
    assert set(final) == delivered, f"{len(set(final) - delivered)} read but never delivered"
    assert max(final.values()) == 1, "a good record was stored more than once"
    # the live consumers: nothing foreign, nothing twice; what they missed, they skipped
    assert set(read) <= delivered, f"{len(set(read) - delivered)} read but never delivered"
    assert max(read.values()) == 1, "a good record was read more than once"
    unexplained = {
        value
        for value in delivered - set(read)
        if not any(p == acks[value][0] and lo <= acks[value][1] < hi for p, lo, hi in gaps)
    }
    assert not unexplained, f"missed without an offset gap: {sorted(unexplained)[:5]}"
    assert bad_codes == Counter({INVALID_RECORD: bad_sent}), bad_codes
    assert bad_stored == 0
    growth = max(s.rss for s in warm) - rss_at_warm
    assert growth <= RSS_GROWTH_LIMIT, f"RSS grew {mib(growth)} MiB after the warm-up"
    connections = PRODUCERS * 2 + CONSUMERS * 2 + 8  # client + upstream side per connection
    assert max(fds) <= baseline.fds + 2 * connections, fds
    assert after.fds <= baseline.fds, f"{after.fds} descriptors after close, {baseline.fds} before"
