"""Real clients through kvproxy's SNI listener: one TLS port in front of three Apache Kafka 4.4
brokers, each client given only `bootstrap.kafka.localhost:PORT` and the test CA (host names
verified against the certificate's `*.kafka.localhost`).

What a user sees: records produced to partitions led by each of the three brokers are read back as
they were produced; Metadata (and DescribeCluster) name every broker `broker-N.kafka.localhost` at
the one port; a record the default checks refuse (no key, compacted topic) fails with the client's
usual error; a fourth broker added to the running cluster is reached through the same port without
restarting the proxy; a name the proxy does not serve gets a TLS alert, never a broker. Clients:
confluent-kafka and kcat (librdkafka), kafka-python, the Java client (kafka-clients 4.4.0).

One cluster (three brokers and a controller) and one `kvproxy serve` serve the module; the broker
added by the last tests (confluent-kafka's first, then kcat's, kafka-python's and the Java
client's, each adding it if it is not there yet) stays until the module ends.
"""

from __future__ import annotations

import re
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.clients import consume
from tests.harness.java_client import run_java_client
from tests.harness.kafka_broker import KAFKA_4, KafkaCluster, run_kafka
from tests.harness.kcat import run_kcat
from tests.harness.metrics import scrape
from tests.harness.processes import wait_until
from tests.harness.proxy_process import ProxyProcess
from tests.harness.sni import (
    BOOTSTRAP_NAME,
    CERTIFICATE_NAMES,
    JAVA_IPV4,
    SniEndpoint,
    accepted_connections,
    sni_proxy,
    wait_for_sni,
)
from tests.harness.tls import make_tls_files

pytestmark = [pytest.mark.kafka, pytest.mark.xdist_group("sni_clients"), pytest.mark.timeout(300)]

PARTITIONS = 3
FAILURES = "kvproxy_tls_handshake_failures_total"
KEYLESS = "Compacted topic cannot accept message without key in topic partition {}-0"


@dataclass
class Stage:
    cluster: KafkaCluster
    proxy: ProxyProcess
    sni: SniEndpoint
    compacted: str

    def spread_topic(self) -> str:
        """A fresh topic of three partitions on brokers 1-3, each led by a different one."""
        topic = self.cluster.create_topic(replicas_on=[[1, 2, 3], [2, 3, 1], [3, 1, 2]])
        leaders = {self.cluster.leader_of(topic, p) for p in range(PARTITIONS)}
        assert leaders == {1, 2, 3}, leaders
        return topic

    def names(self, node_ids: range = range(1, 4)) -> dict[int, str]:
        return {n: self.sni.broker_address(n) for n in node_ids}

    def accepted(self) -> Counter[tuple[str, str]]:
        """Client connections the proxy accepted so far, by (listener, node)."""
        return accepted_connections(self.proxy)

    def added_broker_topic(self) -> str:
        """A fresh topic of one partition led by broker 4, the broker added to the running
        cluster (added here if no test has added it yet)."""
        if all(node.node_id != 4 for node in self.cluster.brokers):
            assert self.cluster.add_broker().node_id == 4
        topic = self.cluster.create_topic(replicas_on=[[4]])
        assert self.cluster.leader_of(topic) == 4
        return topic

    def handshake_failures(self, reason: str) -> float:
        """Failed handshakes on the SNI listener the proxy counted so far for `reason`."""
        samples = scrape(self.proxy)
        return samples.get((FAILURES, (("listener", "sni"), ("reason", reason))), 0.0)


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    directory = tmp_path_factory.mktemp("sni")
    with (
        run_kafka(KAFKA_4, brokers=3) as cluster,
        make_tls_files(directory / "tls", hostnames=CERTIFICATE_NAMES) as tls,
    ):
        proxy, sni = sni_proxy(directory, cluster.bootstrap_servers, tls)
        try:
            proxy.start()
            wait_for_sni(sni)
            compacted = cluster.create_topic(config={"cleanup.policy": "compact"})
            yield Stage(cluster, proxy, sni, compacted)
        finally:
            proxy.close()


def values_for(partition: int, count: int = 3) -> list[bytes]:
    return [f"p{partition}-{n}".encode() for n in range(count)]


def test_names_resolve_to_loopback() -> None:
    """What every client here depends on: names under localhost resolve to loopback without
    an /etc/hosts entry."""
    addresses = {info[4][0] for info in socket.getaddrinfo(BOOTSTRAP_NAME, 1)}
    assert "127.0.0.1" in addresses, addresses
    assert Path("/etc/hosts").read_text().count("kafka.localhost") == 0


# ---- confluent-kafka (librdkafka) ----


def confluent_produce(
    sni: SniEndpoint, topic: str, records: list[tuple[int, bytes | None, bytes]]
) -> tuple[list[Any], dict[int, str]]:
    """Produce (partition, key, value) records; each one's delivery error and the brokers the
    producer's Metadata named (node id: host:port)."""
    from confluent_kafka import Producer

    producer = Producer({**sni.librdkafka(), "acks": "all", "message.timeout.ms": 30000})
    errors: dict[int, Any] = {}
    for n, (partition, key, value) in enumerate(records):
        producer.produce(
            topic,
            value,
            key,
            partition=partition,
            on_delivery=lambda error, _message, n=n: errors.__setitem__(n, error),
        )
    assert producer.flush(45) == 0
    return [errors[n] for n in range(len(records))], named_brokers(producer)


def named_brokers(client: Any) -> dict[int, str]:
    """The brokers a confluent-kafka client's Metadata names (node id: host:port)."""
    brokers = client.list_topics(timeout=15).brokers
    return {n: f"{b.host}:{b.port}" for n, b in brokers.items()}


def confluent_consume(
    sni: SniEndpoint, topic: str, partitions: int
) -> dict[int, list[bytes | None]]:
    """Every value of every partition, from the beginning to the end, through the SNI port."""
    settings = sni.librdkafka()
    return consume(settings["bootstrap.servers"], topic, partitions, settings=settings, timeout=60)


def test_confluent_kafka_produces_to_every_broker_and_reads_back(stage: Stage) -> None:
    topic = stage.spread_topic()
    before = stage.accepted()
    records = [(p, b"k", value) for p in range(PARTITIONS) for value in values_for(p)]
    errors, brokers = confluent_produce(stage.sni, topic, records)
    assert errors == [None] * len(records)
    assert brokers == stage.names()
    assert confluent_consume(stage.sni, topic, PARTITIONS) == {
        p: values_for(p) for p in range(PARTITIONS)
    }
    # every connection came through the SNI port: to the bootstrap and to each broker
    accepted = stage.accepted() - before
    assert {listener for listener, _node in accepted} == {"sni"}, accepted
    assert {node for _listener, node in accepted} == {"bootstrap", "1", "2", "3"}, accepted


def test_confluent_kafka_refusal(stage: Stage) -> None:
    from confluent_kafka import KafkaError

    [refused], _ = confluent_produce(stage.sni, stage.compacted, [(0, None, b"no key")])
    assert str(refused) == (
        'KafkaError{code=INVALID_RECORD,val=87,str="Broker: Broker failed to validate record"}'
    )
    assert refused.code() == KafkaError.INVALID_RECORD and not refused.retriable()


# ---- kcat (librdkafka) ----


def test_kcat_produces_consumes_and_lists_the_names(stage: Stage) -> None:
    topic = stage.spread_topic()
    for p in range(PARTITIONS):
        lines = b"".join(value + b"\n" for value in values_for(p))
        done = run_kcat([*stage.sni.kcat(), "-P", "-t", topic, "-p", str(p)], input_bytes=lines)
        assert done.returncode == 0, done
    done = run_kcat(
        [*stage.sni.kcat(), "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%p %s\\n"],
        timeout=60,
    )
    assert done.returncode == 0, done
    read: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for line in done.stdout.splitlines():
        partition, value = line.split(b" ", 1)
        read[int(partition)].append(value)
    assert read == {p: values_for(p) for p in range(PARTITIONS)}

    listed = run_kcat([*stage.sni.kcat(), "-L", "-t", topic])
    assert listed.returncode == 0, listed
    text = listed.stdout.decode()
    brokers = dict(re.findall(r"^\s+broker (\d+) at (\S+)", text, re.MULTILINE))
    assert {int(n): address for n, address in brokers.items()} == stage.names(), text
    leaders = re.findall(r"^\s+partition \d+, leader (\d+),", text, re.MULTILINE)
    assert sorted(map(int, leaders)) == [1, 2, 3], text

    refused = run_kcat([*stage.sni.kcat(), "-P", "-t", stage.compacted], input_bytes=b"no key\n")
    assert refused.returncode == 1, refused
    assert refused.stderr.decode().splitlines() == [
        "% Delivery failed for message: Broker: Broker failed to validate record"
    ]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("nothing.kafka.localhost", "no_matching_name"),
        ("broker-77.kafka.localhost", "unknown_node"),
    ],
)
def test_kcat_naming_nothing_the_proxy_serves_gets_a_tls_alert(
    stage: Stage, name: str, reason: str
) -> None:
    """A name that matches no pattern, and a broker the cluster does not have: the handshake
    ends with the alert `unrecognized_name` (no connection to any broker), logged with the name
    and counted by reason."""
    before = stage.handshake_failures(reason)
    options = stage.sni.kcat()
    options[1] = f"{name}:{stage.sni.port}"
    done = run_kcat([*options, "-L", "-m", "3"])
    # kcat exits 1 saying so, or is killed by a crash of its own on the way out (seen once:
    # SIGSEGV, -11, after "Broker transport failure"); the proxy's side is asserted either way
    assert done.returncode == 1 or done.returncode < 0, done
    if done.returncode == 1:
        assert (
            "SSL handshake failed: error:0A000458:SSL routines::tlsv1 unrecognized name: "
            "SSL alert number 112"
        ) in done.stderr.decode(), done.stderr
    logged = f"server name '{name}': {reason} (refused by the server name's route)"
    wait_until(
        lambda: logged in stage.proxy.log.read_text(), f"the proxy's log line of the {reason}"
    )
    assert stage.handshake_failures(reason) > before


# ---- kafka-python ----


def test_kafka_python_produces_consumes_and_is_refused(stage: Stage) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import InvalidRecordError

    topic = stage.spread_topic()
    producer = KafkaProducer(**stage.sni.kafka_python(), acks="all", retries=0)
    try:
        sent = [
            producer.send(topic, key=b"k", value=value, partition=p)
            for p in range(PARTITIONS)
            for value in values_for(p)
        ]
        producer.flush(30)
        assert [future.get(timeout=30).partition for future in sent] == [
            p for p in range(PARTITIONS) for _ in values_for(p)
        ]
        refused = producer.send(stage.compacted, value=b"no key", partition=0)
        with pytest.raises(InvalidRecordError) as error:
            refused.get(timeout=30)
    finally:
        producer.close(10)
    assert str(error.value) == f"[Error 87] InvalidRecordError: {KEYLESS.format(stage.compacted)}"

    consumer = KafkaConsumer(**stage.sni.kafka_python(), enable_auto_commit=False)
    read: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 60
        while sum(map(len, read.values())) < len(sent) and time.monotonic() < deadline:
            for part, messages in consumer.poll(timeout_ms=500).items():
                read[part.partition] += [message.value for message in messages]
    finally:
        consumer.close()
    assert read == {p: values_for(p) for p in range(PARTITIONS)}

    admin = KafkaAdminClient(**stage.sni.kafka_python())
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    named = {b["broker_id"]: f"{b['host']}:{b['port']}" for b in cluster["brokers"]}
    assert named == stage.names()


# ---- the Java client (kafka-clients 4.4.0) ----


def java(command: str, stage: Stage, **args: Any) -> dict[str, Any]:
    run = run_java_client(
        command, stage.sni.bootstrap, props=stage.sni.java(), jvm=JAVA_IPV4, **args
    )
    return run.result


def test_java_client_produces_consumes_and_is_refused(stage: Stage) -> None:
    topic = stage.spread_topic()
    values = [f"java-{n}" for n in range(12)]
    results = java("produce", stage, topic=topic, values="\n".join(values))["results"]
    assert [r.get("error") for r in results] == [None] * len(values)
    assert {r["partition"] for r in results} == set(range(PARTITIONS))  # every leader reached

    group = f"sni-{uuid.uuid4().hex[:8]}"
    members = java("consume", stage, topic=topic, group=group)["members"]
    read = Counter(value for member in members for _key, value, _p, _o in member["records"])
    assert read == Counter(values)

    nodes = java("nodes", stage)["nodes"]
    assert {n: f"{host}:{port}" for n, host, port in nodes} == stage.names()

    [refused] = java("produce", stage, topic=stage.compacted, values="no key", null_key="true")[
        "results"
    ]
    assert refused["error"] == refused["callback_error"]
    assert (refused["error"]["class"], refused["error"]["message"]) == (
        "org.apache.kafka.common.InvalidRecordException",
        KEYLESS.format(stage.compacted),
    )


# ---- a broker added to the running cluster (last: the cluster keeps it; confluent-kafka's test
# adds it, the others add it if they run alone) ----


def test_a_broker_added_later_is_reached_through_the_same_port(stage: Stage) -> None:
    from confluent_kafka import Producer

    process = stage.proxy.proc
    assert process is not None
    before = stage.accepted()
    producer = Producer({**stage.sni.librdkafka(), "acks": "all", "message.timeout.ms": 30000})
    known = len(stage.cluster.brokers)  # 3, or 4 when another of these tests added it first
    assert named_brokers(producer) == stage.names(range(1, known + 1))

    topic = stage.added_broker_topic()  # the broker is added here unless it was already

    errors: list[Any] = []
    for value in values_for(0):
        producer.produce(
            topic, value, b"k", partition=0, on_delivery=lambda e, _m: errors.append(e)
        )
    assert producer.flush(45) == 0
    assert errors == [None] * 3
    assert named_brokers(producer) == stage.names(range(1, 5))
    assert confluent_consume(stage.sni, topic, 1) == {0: values_for(0)}
    assert ("sni", "4") in stage.accepted() - before
    assert stage.proxy.starts == 1 and stage.proxy.proc is process and process.poll() is None


def test_kcat_reaches_the_added_broker_through_the_same_port(stage: Stage) -> None:
    topic = stage.added_broker_topic()
    before = stage.accepted()
    lines = b"".join(value + b"\n" for value in values_for(0))
    done = run_kcat([*stage.sni.kcat(), "-P", "-t", topic, "-p", "0"], input_bytes=lines)
    assert done.returncode == 0, done
    done = run_kcat(
        [*stage.sni.kcat(), "-C", "-t", topic, "-o", "beginning", "-e", "-q"], timeout=60
    )
    assert done.returncode == 0, done
    assert done.stdout.splitlines() == values_for(0)

    listed = run_kcat([*stage.sni.kcat(), "-L", "-t", topic])
    assert listed.returncode == 0, listed
    text = listed.stdout.decode()
    brokers = dict(re.findall(r"^\s+broker (\d+) at (\S+)", text, re.MULTILINE))
    assert {int(n): address for n, address in brokers.items()} == stage.names(range(1, 5)), text
    assert re.findall(r"^\s+partition 0, leader (\d+),", text, re.MULTILINE) == ["4"], text
    assert ("sni", "4") in stage.accepted() - before  # broker 4 through the SNI port


def test_kafka_python_reaches_the_added_broker_through_the_same_port(stage: Stage) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

    topic = stage.added_broker_topic()
    before = stage.accepted()
    producer = KafkaProducer(**stage.sni.kafka_python(), acks="all", retries=0)
    try:
        sent = [producer.send(topic, key=b"k", value=value, partition=0) for value in values_for(0)]
        producer.flush(30)
        assert [future.get(timeout=30).offset for future in sent] == [0, 1, 2]
    finally:
        producer.close(10)

    consumer = KafkaConsumer(**stage.sni.kafka_python(), enable_auto_commit=False)
    read: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 60
        while len(read) < len(sent) and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=500).values():
                read += [message.value for message in messages]
    finally:
        consumer.close()
    assert read == values_for(0)

    admin = KafkaAdminClient(**stage.sni.kafka_python())
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    named = {b["broker_id"]: f"{b['host']}:{b['port']}" for b in cluster["brokers"]}
    assert named == stage.names(range(1, 5))
    assert ("sni", "4") in stage.accepted() - before  # broker 4 through the SNI port


def test_java_client_reaches_the_added_broker_through_the_same_port(stage: Stage) -> None:
    topic = stage.added_broker_topic()
    before = stage.accepted()
    values = [f"java-{n}" for n in range(3)]
    results = java("produce", stage, topic=topic, values="\n".join(values))["results"]
    assert [r.get("error") for r in results] == [None] * len(values)
    assert {r["partition"] for r in results} == {0}

    group = f"sni-{uuid.uuid4().hex[:8]}"
    members = java("consume", stage, topic=topic, group=group)["members"]
    read = [value for member in members for _key, value, _p, _o in member["records"]]
    assert read == values

    nodes = java("nodes", stage)["nodes"]
    assert {n: f"{host}:{port}" for n, host, port in nodes} == stage.names(range(1, 5))
    assert ("sni", "4") in stage.accepted() - before  # broker 4 through the SNI port
