"""Broker and proxy faults under a steady stream of numbered records, and the tally of what was
acknowledged against what a consumer reads back.

    producers = [ConfluentNumbered(bootstrap, topic, 3, "ck"), PythonNumbered(...)]
    with streaming(producers):            # each producer in a thread of its own, paced
        wait_for_acks(producers, ...)      # by asking, never by sleeping a fixed time
        cluster.node(leader).kill()
        ...
    tally = tally_of(producers, read_back(bootstrap, topic, 3))
    assert tally.lost == 0 and tally.duplicated == 0

Values (``ck-0000042``) are unique per producer and spread over every partition. Broker addresses
a client learned come from the client (librdkafka's statistics, kafka-python's metadata) and from
the proxy's tap."""

from __future__ import annotations

import abc
import contextlib
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvproxy.protocol.messages import (
    DESCRIBE_CLUSTER,
    FETCH,
    FIND_COORDINATOR,
    METADATA,
    PRODUCE,
    decode_response,
)
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.processes import wait_until

HOST = "127.0.0.1"
DELIVERY_TIMEOUT_MS = 120_000
"""How long a client may keep retrying a record: far longer than a leader election or a proxy
restart on a loaded machine, so a record fails only if something is really wrong."""
PACE_S = 0.008
"""One record every 8 ms per producer: thousands of records in a run of 20-40 s."""
NOT_LEADER_OR_FOLLOWER = 6


@dataclass
class Numbered(abc.ABC):
    """A producer thread sending `tag-NNNNNNN` to partition N mod `partitions`; what each record
    became is kept: acknowledged (with partition and offset) or failed (with the error)."""

    bootstrap: str
    topic: str
    partitions: int
    tag: str
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    failed: dict[bytes, str] = field(default_factory=dict)
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def acked_on(self, partition: int) -> int:
        with self._lock:
            return sum(1 for p, _ in self.acked.values() if p == partition)

    def last_offset(self, partition: int) -> int:
        """The highest offset acknowledged on `partition` so far (-1: none)."""
        with self._lock:
            return max((o for p, o in self.acked.values() if p == partition), default=-1)

    def _ack(self, value: bytes, partition: int, offset: int) -> None:
        with self._lock:
            self.acked[value] = (partition, offset)

    def _fail(self, value: bytes, error: object) -> None:
        with self._lock:
            self.failed[value] = str(error)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.tag, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.open()
            next_at = time.monotonic()
            while not self.stop.is_set():
                value = f"{self.tag}-{self.sent:07d}".encode()
                self.send(value, self.sent % self.partitions)
                self.sent += 1
                next_at += PACE_S
                self.stop.wait(max(0.0, next_at - time.monotonic()))
            self.finish(DELIVERY_TIMEOUT_MS / 1000 + 30)
        except BaseException as error:  # reported by join()
            self.error = error

    def join(self) -> None:
        self.stop.set()
        assert self._thread is not None
        self._thread.join(DELIVERY_TIMEOUT_MS / 1000 + 60)
        assert not self._thread.is_alive(), f"{self.tag} did not finish"
        if self.error is not None:
            raise self.error
        unsettled = self.sent - len(self.acked) - len(self.failed)
        assert unsettled == 0, f"{self.tag}: {unsettled} records neither acknowledged nor failed"

    @abc.abstractmethod
    def open(self) -> None:
        """Make the client (in the producer's thread)."""

    @abc.abstractmethod
    def send(self, value: bytes, partition: int) -> None:
        """Hand one record to the client; acknowledgements arrive through callbacks."""

    @abc.abstractmethod
    def finish(self, timeout: float) -> None:
        """Wait up to `timeout` seconds until every record sent is settled."""

    @abc.abstractmethod
    def broker_addresses(self) -> set[tuple[str, int]]:
        """Every broker address the client has known (bootstrap included)."""


@dataclass
class ConfluentNumbered(Numbered):
    """librdkafka (confluent-kafka): idempotent, acks=all; its statistics name every broker
    connection it ever had, the bootstrap one included."""

    known: set[tuple[str, int]] = field(default_factory=set)

    def open(self) -> None:
        from confluent_kafka import Producer

        self._producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": DELIVERY_TIMEOUT_MS,
                "statistics.interval.ms": 500,
                "stats_cb": self._stats,
            }
        )

    def _stats(self, text: str) -> None:
        for broker in json.loads(text)["brokers"].values():
            host, _, port = broker["nodename"].rpartition(":")
            if port:
                with self._lock:
                    self.known.add((host, int(port)))

    def send(self, value: bytes, partition: int) -> None:
        def delivered(error: Any, message: Any) -> None:
            if error is None:
                self._ack(message.value(), message.partition(), message.offset())
            else:
                self._fail(message.value(), error)

        self._producer.produce(self.topic, value, partition=partition, on_delivery=delivered)
        self._producer.poll(0)

    def finish(self, timeout: float) -> None:
        self._producer.flush(timeout)
        self._producer.poll(0.6)  # one more statistics report
        self._producer = None  # its stats callback holds this object: free it now, not at GC

    def broker_addresses(self) -> set[tuple[str, int]]:
        with self._lock:
            return set(self.known)


@dataclass
class PythonNumbered(Numbered):
    """kafka-python: idempotent, acks=all; its cluster metadata names the brokers it knows."""

    def open(self) -> None:
        from kafka import KafkaProducer

        self._producer = KafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            delivery_timeout_ms=DELIVERY_TIMEOUT_MS,
            request_timeout_ms=30_000,
        )
        self._known: set[tuple[str, int]] = set()

    def send(self, value: bytes, partition: int) -> None:
        future = self._producer.send(self.topic, value, partition=partition)
        future.add_callback(lambda meta, v=value: self._ack(v, meta.partition, meta.offset))
        future.add_errback(lambda error, v=value: self._fail(v, error))
        if self.sent % 200 == 0:
            self._remember()

    def _remember(self) -> None:
        for broker in self._producer._metadata.brokers():
            self._known.add((broker.host, int(broker.port)))

    def finish(self, timeout: float) -> None:
        self._producer.flush(timeout)
        self._remember()
        self._producer.close(10)

    def broker_addresses(self) -> set[tuple[str, int]]:
        return set(self._known)


@contextlib.contextmanager
def streaming(producers: Sequence[Numbered]) -> Iterator[None]:
    """The producers run inside the block; on leaving they stop, flush and are checked."""
    for producer in producers:
        producer.start()
    try:
        yield
    finally:
        for producer in producers:
            producer.stop.set()
        for producer in producers:
            producer.join()


def wait_for_acks(
    producers: Sequence[Numbered], partition: int, more: int, what: str, timeout: float = 90
) -> None:
    """Until each producer has `more` acknowledgements on `partition` beyond what it has now."""
    start = {p.tag: p.acked_on(partition) for p in producers}

    def enough() -> bool:
        for producer in producers:
            if producer.error is not None:
                raise AssertionError(f"{producer.tag} failed: {producer.error!r}")
        return all(p.acked_on(partition) >= start[p.tag] + more for p in producers)

    wait_until(enough, f"{more} more acknowledgements on partition {partition} ({what})", timeout)


# ---- reading back and counting ----


class Follower:
    """A consumer (confluent-kafka) reading every partition from the beginning in a thread of its
    own, how often it read each value, until told where the partitions end."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.stored: Counter[bytes] = Counter()
        self.next_offset = dict.fromkeys(range(partitions), 0)
        self.ends: dict[int, int] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="follower", daemon=True)

    def start(self) -> Follower:
        self._thread.start()
        return self

    def _done(self) -> bool:
        ends = self.ends
        return ends is not None and all(self.next_offset[p] >= ends[p] for p in ends)

    def _run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        try:
            consumer = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": "follower",
                    "enable.auto.commit": False,
                }
            )
            try:
                consumer.assign(
                    [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in self.next_offset]
                )
                while not self._done():
                    message = consumer.poll(0.2)
                    if message is None or message.error() is not None:
                        continue
                    self.stored[message.value() or b""] += 1
                    self.next_offset[message.partition() or 0] = (message.offset() or 0) + 1
            finally:
                consumer.close()
        except BaseException as error:  # reported by finish()
            self.error = error

    def read_past(self, partition: int, offset: int, timeout: float = 90) -> None:
        """Until the consumer has read `partition` beyond `offset`."""
        wait_until(
            lambda: self.error is not None or self.next_offset[partition] > offset,
            f"the consumer to read {self.topic}/{partition} past offset {offset}",
            timeout,
        )
        if self.error is not None:
            raise self.error

    def finish(self, ends: dict[int, int], timeout: float = 90) -> Counter[bytes]:
        """Read up to `ends` (partition -> high watermark), stop, and how often each value was
        read."""
        self.ends = ends
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"read {self.next_offset} of {ends} in {timeout} s"
        if self.error is not None:
            raise self.error
        return self.stored


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def read_back(bootstrap: str, topic: str, partitions: int, timeout: float = 90) -> Counter[bytes]:
    """How often each value is stored, read from the beginning of every partition up to its
    high watermark with confluent-kafka through `bootstrap`."""
    ends = high_watermarks(bootstrap, topic, partitions)
    return Follower(bootstrap, topic, partitions).start().finish(ends, timeout)


@dataclass(frozen=True)
class Tally:
    """One run's counts: `lost` and `duplicated` must be 0; `failed` records were never
    acknowledged (the client gave up), `stored_unacked` were stored without an acknowledgement
    (allowed: the client did not see the answer)."""

    acknowledged: int
    failed: int
    stored: int
    duplicated: int
    lost: int
    stored_unacked: int

    def __str__(self) -> str:
        return (
            f"acknowledged {self.acknowledged}, failed {self.failed}, stored {self.stored}, "
            f"duplicated {self.duplicated}, lost {self.lost}, "
            f"stored without acknowledgement {self.stored_unacked}"
        )


def tally_of(producers: Iterable[Numbered], stored: Counter[bytes]) -> Tally:
    acked: set[bytes] = set()
    failed = 0
    for producer in producers:
        acked |= producer.acked.keys()
        failed += len(producer.failed)
    return Tally(
        acknowledged=len(acked),
        failed=failed,
        stored=sum(stored.values()),
        duplicated=sum(n - 1 for n in stored.values() if n > 1),
        lost=len(acked - stored.keys()),
        stored_unacked=len(stored.keys() - acked),
    )


def print_tally(name: str, tally: object) -> None:
    """One line in the test output (pytest -s) and in the log of a run, for the docs."""
    print(f"[cluster fault run] {name}: {tally}", file=sys.stderr)


# ---- what clients were told ----


def addresses_in_answers(responses: Iterable[tuple[int, int, bytes]]) -> set[tuple[str, int]]:
    """Every broker address in the answers a proxy sent (its tap): Metadata and DescribeCluster
    brokers, FindCoordinator coordinators, Produce v10+ and Fetch v16+ `node_endpoints`."""
    found: set[tuple[str, int]] = set()
    for api_key, version, frame in responses:
        if api_key not in (METADATA, DESCRIBE_CLUSTER, FIND_COORDINATOR, PRODUCE, FETCH):
            continue
        body = decode_response(frame, api_key, version).body
        if api_key in (METADATA, DESCRIBE_CLUSTER):
            nodes = body.brokers
        elif api_key == FIND_COORDINATOR:
            nodes = body.coordinators if version >= 4 else (body,)
        else:
            nodes = getattr(body, "node_endpoints", ())
        found |= {(str(n.host), int(n.port)) for n in nodes if int(n.port) >= 0}
    return found


def not_leader_answers(responses: Iterable[tuple[int, int, bytes]]) -> list[tuple[int, Any, Any]]:
    """The partition answers with NOT_LEADER_OR_FOLLOWER among the Produce answers sent:
    (version, partition answer, the body's `node_endpoints`, empty below v10)."""
    found = []
    for api_key, version, frame in responses:
        if api_key != PRODUCE:
            continue
        body = decode_response(frame, PRODUCE, version).body
        for topic in body.responses:
            for answer in topic.partition_responses:
                if int(answer.error_code) == NOT_LEADER_OR_FOLLOWER:
                    found.append((version, answer, getattr(body, "node_endpoints", ())))
    return found


# ---- the cluster ----

PARTITIONS = 3
BROKERS = (1, 2, 3)
ACKS_PER_PHASE = 100
"""Acknowledgements each producer must get on the killed leader's partition in each phase."""


def restore(cluster: KafkaCluster) -> None:
    """Start every broker that is not running (a test killed it) and wait until it rejoined."""
    for node in cluster.brokers:
        if not node.running:
            cluster.restart(node.node_id)


def spread_topic(cluster: KafkaCluster) -> str:
    """A fresh topic of 3 partitions whose leaders are brokers 1, 2 and 3."""
    topic = cluster.create_topic(partitions=PARTITIONS)
    leaders = {cluster.leader_of(topic, p) for p in range(PARTITIONS)}
    assert leaders == set(BROKERS), f"leaders of {topic}: {leaders}"
    return topic


def new_leader(cluster: KafkaCluster, topic: str, partition: int, old: int) -> int:
    """Until the cluster (asked directly) names a leader of `partition` other than `old`."""
    admin = cluster.admin()

    def leader() -> int | None:
        found = admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader
        return int(found) if found not in (-1, old) else None

    return wait_until(leader, f"a leader of {topic}/{partition} other than {old}", 90)


def kill_leader_and_restart(
    cluster: KafkaCluster,
    topic: str,
    producers: Sequence[Numbered],
    follower: Follower | None = None,
    partition: int = 0,
) -> tuple[int, int]:
    """With `producers` running: acknowledgements on `partition`, kill -9 of its leader, a new
    leader and acknowledgements from it (and `follower` reading them), the old leader started
    again (rejoined), then made leader again, and acknowledgements after each step.
    (killed leader, interim leader)."""
    victim = cluster.leader_of(topic, partition)
    wait_for_acks(producers, partition, ACKS_PER_PHASE, "before the kill")
    cluster.node(victim).kill()
    successor = new_leader(cluster, topic, partition, victim)
    wait_for_acks(producers, partition, ACKS_PER_PHASE, f"from the new leader {successor}")
    if follower is not None:
        follower.read_past(partition, max(p.last_offset(partition) for p in producers))
    cluster.restart(victim)
    wait_for_acks(producers, partition, ACKS_PER_PHASE, f"after broker {victim} rejoined")
    lead_again(cluster, topic, partition, victim)
    wait_for_acks(producers, partition, ACKS_PER_PHASE, f"from broker {victim}, leader again")
    return victim, successor


def lead_again(cluster: KafkaCluster, topic: str, partition: int, preferred: int) -> None:
    """A preferred leader election until `preferred` (the first replica: the leader a fresh
    topic had) leads `partition` again: clients must go back to the restarted broker. It fails
    until the broker has caught up and is in sync, so it is asked again."""
    from confluent_kafka import ElectionType, TopicPartition

    admin = cluster.admin()
    wanted = [TopicPartition(topic, partition)]

    def elected() -> bool:
        with contextlib.suppress(Exception):  # not in sync yet (or no election needed)
            admin.elect_leaders(ElectionType.PREFERRED, wanted).result(timeout=10)
        found = admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader
        return int(found) == preferred

    wait_until(elected, f"broker {preferred} to lead {topic}/{partition} again", 90)
