"""Three Apache Kafka brokers (ids 1, 2, 3) behind one kvproxy, a port per broker: the leader of
a partition killed with kill -9 and started again while idempotent acks=all producers
(librdkafka and kafka-python) write numbered records through the proxy.

What a user would check: every record the client was told is stored is read back exactly once
(by value, with a consumer through the proxy), the clients keep writing to the partition once it
has a new leader (they can only reach it through the proxy's listener for that broker), and no
client ever learns a broker's own address. A broker that is not the leader answers
NOT_LEADER_OR_FOLLOWER naming the leader (Produce v10+): its address reaches the client as the
proxy's.

The same fault with kvproxy as a user runs it, `kvproxy serve --workers 2` (a supervisor and two
workers sharing the listeners), and kvproxy itself stopped (SIGTERM) or killed (SIGKILL) and
started again on the same ports mid-stream. There is no tap in another process: what the clients
learned is read from the clients, and a raw Metadata request checks the answers.

One cluster (four JVMs: three brokers and a controller) serves the module; a test that kills a
broker starts it again before the next test. Counts of each run are printed (`pytest -s`) and
recorded in docs/reliability.md.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvproxy.protocol.messages import FETCH, METADATA, PRODUCE, decode_response
from tests.harness.cluster_faults import (
    ACKS_PER_PHASE,
    NOT_LEADER_OR_FOLLOWER,
    PARTITIONS,
    ConfluentNumbered,
    Follower,
    Numbered,
    PythonNumbered,
    addresses_in_answers,
    high_watermarks,
    kill_leader_and_restart,
    lead_again,
    new_leader,
    not_leader_answers,
    print_tally,
    read_back,
    restore,
    spread_topic,
    streaming,
    tally_of,
    wait_for_acks,
    wait_until,
)
from tests.harness.kafka_broker import KAFKA_4, KafkaCluster, run_kafka
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.proxy_process import ProxyProcess
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import fetch_request, metadata_request, produce_request, topic_id_of

pytestmark = [pytest.mark.kafka, pytest.mark.xdist_group("kafka_cluster")]

HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    with run_kafka(KAFKA_4, brokers=3) as running:
        yield running


@pytest.fixture
def healthy(cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    """The module's cluster with every broker running, before and after the test."""
    restore(cluster)
    yield cluster
    restore(cluster)


@pytest.fixture
def proxy(healthy: KafkaCluster) -> Iterator[RunningProxy]:
    with run_proxy(healthy.bootstrap_servers, max_brokers=10) as running:
        yield running


def proxy_addresses(proxy: RunningProxy) -> set[tuple[str, int]]:
    return {(HOST, proxy.port)} | {(HOST, proxy.broker_port(n)) for n in (1, 2, 3)}


def broker_addresses(cluster: KafkaCluster) -> set[tuple[str, int]]:
    return {(HOST, node.port) for node in cluster.brokers}


def test_metadata_through_the_proxy_names_only_proxy_listeners(
    healthy: KafkaCluster, proxy: RunningProxy
) -> None:
    """librdkafka's view of the cluster through the proxy: three brokers, each at a proxy port,
    and partitions led by all three."""
    from confluent_kafka.admin import AdminClient

    topic = spread_topic(healthy)
    metadata = AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(topic, timeout=30)
    assert {(b.id, b.host, b.port) for b in metadata.brokers.values()} == {
        (n, HOST, proxy.broker_port(n)) for n in (1, 2, 3)
    }
    leaders = {p.leader for p in metadata.topics[topic].partitions.values()}
    assert leaders == {1, 2, 3}
    assert addresses_in_answers(proxy.responses) <= proxy_addresses(proxy)


def test_leader_killed_and_restarted_nothing_acknowledged_lost_or_doubled(
    healthy: KafkaCluster, proxy: RunningProxy
) -> None:
    """kill -9 of partition 0's leader, then its restart, while librdkafka and kafka-python
    (both idempotent, acks=all) write through the proxy."""
    topic = spread_topic(healthy)
    producers = [
        ConfluentNumbered(proxy.bootstrap, topic, PARTITIONS, "librdkafka"),
        PythonNumbered(proxy.bootstrap, topic, PARTITIONS, "kafka-python"),
    ]
    follower = Follower(proxy.bootstrap, topic, PARTITIONS).start()
    with streaming(producers):
        victim, successor = kill_leader_and_restart(healthy, topic, producers, follower)
    assert successor != victim

    stored = read_back(proxy.bootstrap, topic, PARTITIONS)
    tally = tally_of(producers, stored)
    print_tally("in-process kvproxy, leader kill -9 and restart", tally)
    assert (tally.lost, tally.duplicated, tally.failed) == (0, 0, 0), tally
    # the consumer that read through the fault, following the leader too, read the same
    assert follower.finish(high_watermarks(proxy.bootstrap, topic, PARTITIONS)) == stored
    assert tally.acknowledged >= 4 * ACKS_PER_PHASE

    allowed = proxy_addresses(proxy)
    for producer in producers:
        assert producer.broker_addresses(), f"{producer.tag} reported no broker at all"
        assert producer.broker_addresses() <= allowed, producer.tag
        assert not producer.broker_addresses() & broker_addresses(healthy), producer.tag
    answered = addresses_in_answers(proxy.responses)
    assert answered <= allowed and not answered & broker_addresses(healthy)
    refused = not_leader_answers(proxy.responses)
    print_tally(
        "NOT_LEADER_OR_FOLLOWER answers sent",
        f"{len(refused)}, by Produce version {Counter(v for v, _, _ in refused)}",
    )
    # the leader moved back by election while the clients wrote: the interim leader refused
    # their next requests naming broker `victim`, which a client at Produce v10+ learns at its
    # proxy port
    named = [
        (
            int(answer.current_leader.leader_id),
            [(int(e.node_id), e.host, int(e.port)) for e in ends],
        )
        for version, answer, ends in refused
        if version >= 10
    ]
    assert (victim, [(victim, HOST, proxy.broker_port(victim))]) in named, refused
    for leader, endpoints in named:
        assert all(port == proxy.broker_port(node) for node, _, port in endpoints), named
        assert leader < 0 or leader in {node for node, _, _ in endpoints}, named


@pytest.mark.parametrize("version", [10, 12])
def test_produce_to_a_follower_names_the_leader_at_its_proxy_port(
    healthy: KafkaCluster, proxy: RunningProxy, version: int
) -> None:
    """A raw Produce v10+ sent to the proxy listener of a broker that is not the partition's
    leader: the broker answers NOT_LEADER_OR_FOLLOWER with `current_leader` and
    `node_endpoints`, and the endpoint reaches the client with the proxy's address."""
    topic = spread_topic(healthy)
    leader = healthy.leader_of(topic, 0)
    follower = next(n for n in (1, 2, 3) if n != leader)
    with RawKafkaClient(HOST, proxy.port) as client:  # opens the broker listeners
        client.request(metadata_request(12, 1, [topic]))
    with RawKafkaClient(HOST, proxy.broker_port(follower)) as client:
        frame = client.request(produce_request(version, 2, topic, [(b"k", b"to-a-follower")]))
    body = decode_response(frame, PRODUCE, version).body
    ((answer,),) = [t.partition_responses for t in body.responses]
    assert int(answer.error_code) == NOT_LEADER_OR_FOLLOWER
    assert int(answer.current_leader.leader_id) == leader
    assert int(answer.current_leader.leader_epoch) >= 0
    assert [(int(e.node_id), e.host, int(e.port)) for e in body.node_endpoints] == [
        (leader, HOST, proxy.broker_port(leader))
    ]
    # the same answer straight from the broker carries the broker's own address
    with RawKafkaClient(HOST, healthy.node(follower).port) as client:
        frame = client.request(produce_request(version, 3, topic, [(b"k", b"direct")]))
    direct = decode_response(frame, PRODUCE, version).body
    assert [(int(e.node_id), e.host, int(e.port)) for e in direct.node_endpoints] == [
        (leader, HOST, healthy.node(leader).port)
    ]
    assert read_back(proxy.bootstrap, topic, 1) == {}  # the refused records were not written


@pytest.mark.parametrize("version", [16, 17])
def test_fetch_from_a_broker_without_the_partition_names_the_leader_at_its_proxy_port(
    healthy: KafkaCluster, proxy: RunningProxy, version: int
) -> None:
    """A raw Fetch v16+ (topic by id) sent to the proxy listener of a broker that holds no
    replica of the partition (a follower would serve it, KIP-392): NOT_LEADER_OR_FOLLOWER with
    `current_leader`, and `node_endpoints` naming the leader at its proxy port."""
    topic = healthy.create_topic(partitions=1, replication_factor=1)
    leader = healthy.leader_of(topic, 0)
    other = next(n for n in (1, 2, 3) if n != leader)
    with RawKafkaClient(HOST, proxy.port) as client:
        topic_id = topic_id_of(client, topic)
    with RawKafkaClient(HOST, proxy.broker_port(other)) as client:
        frame = client.request(fetch_request(version, 4, topic_id, max_wait_ms=0))
    body = decode_response(frame, FETCH, version).body
    ((answer,),) = [t.partitions for t in body.responses]
    assert int(answer.error_code) == NOT_LEADER_OR_FOLLOWER
    assert int(answer.current_leader.leader_id) == leader
    assert [(int(e.node_id), e.host, int(e.port)) for e in body.node_endpoints] == [
        (leader, HOST, proxy.broker_port(leader))
    ]


def test_raw_metadata_through_the_proxy_after_a_leader_change_names_proxy_ports(
    healthy: KafkaCluster, proxy: RunningProxy
) -> None:
    """With a broker down, Metadata v12 through the proxy names the two live brokers at proxy
    ports and the partition's new leader; after the restart, all three again."""
    topic = spread_topic(healthy)
    victim = healthy.leader_of(topic, 0)
    healthy.node(victim).kill()

    def answer() -> object:
        with RawKafkaClient(HOST, proxy.port) as client:
            frame = client.request(metadata_request(12, 7, [topic]))
        body = decode_response(frame, METADATA, 12).body
        leader = int(next(p for p in body.topics[0].partitions if p.partition_index == 0).leader_id)
        return body if leader not in (-1, victim) else None

    body = wait_until(answer, "a new leader of partition 0 through the proxy", 60)
    assert {(int(b.node_id), b.host, int(b.port)) for b in body.brokers} == {
        (n, HOST, proxy.broker_port(n)) for n in (1, 2, 3) if n != victim
    }
    healthy.restart(victim)
    with RawKafkaClient(HOST, proxy.port) as client:
        body = decode_response(client.request(metadata_request(12, 8)), METADATA, 12).body
    assert {(int(b.node_id), b.host, int(b.port)) for b in body.brokers} == {
        (n, HOST, proxy.broker_port(n)) for n in (1, 2, 3)
    }


# ---- kvproxy as a process ----


@pytest.fixture
def proxy_process(healthy: KafkaCluster, tmp_path: Path) -> Iterator[ProxyProcess]:
    """`kvproxy serve` in front of the cluster, not started (each test picks its workers)."""
    running = ProxyProcess.in_front_of(tmp_path, healthy.bootstrap_servers)
    try:
        yield running
    finally:
        running.close()


def assert_clients_saw_only(
    process: ProxyProcess, producers: list[Numbered], cluster: KafkaCluster
) -> None:
    """Each client knew only proxy addresses, and Metadata through the proxy names only them."""
    allowed = {(HOST, port) for port in process.ports}
    for producer in producers:
        known = producer.broker_addresses()
        assert known, f"{producer.tag} reported no broker at all"
        assert known <= allowed and not known & broker_addresses(cluster), (producer.tag, known)
    with RawKafkaClient(HOST, process.config["listen"]["port"]) as client:
        body = decode_response(client.request(metadata_request(12, 9)), METADATA, 12).body
    assert {(int(b.node_id), b.host, int(b.port)) for b in body.brokers} == {
        (n, HOST, process.config["listen"]["broker_port_base"] + n) for n in (1, 2, 3)
    }


def test_leader_killed_and_restarted_behind_two_workers(
    healthy: KafkaCluster, proxy_process: ProxyProcess
) -> None:
    """`kvproxy serve --workers 2`: the same kill -9 and restart of partition 0's leader."""
    proxy_process.workers = 2
    proxy_process.start()
    topic = spread_topic(healthy)
    producers = [
        ConfluentNumbered(proxy_process.bootstrap, topic, PARTITIONS, "librdkafka"),
        PythonNumbered(proxy_process.bootstrap, topic, PARTITIONS, "kafka-python"),
    ]
    with streaming(producers):
        victim, successor = kill_leader_and_restart(healthy, topic, producers)
    assert successor != victim

    tally = tally_of(producers, read_back(proxy_process.bootstrap, topic, PARTITIONS))
    print_tally("kvproxy --workers 2, leader kill -9 and restart", tally)
    assert (tally.lost, tally.duplicated, tally.failed) == (0, 0, 0), tally
    assert_clients_saw_only(proxy_process, producers, healthy)
    assert proxy_process.proc is not None and proxy_process.proc.poll() is None


@pytest.mark.parametrize(
    ("how", "workers"),
    [(signal.SIGTERM, 1), (signal.SIGKILL, 1), (signal.SIGTERM, 2)],
    ids=["sigterm", "sigkill", "sigterm-workers-2"],
)
def test_kvproxy_restarted_mid_stream(
    healthy: KafkaCluster, proxy_process: ProxyProcess, how: signal.Signals, workers: int
) -> None:
    """kvproxy stopped (SIGTERM: it drains; with workers, the supervisor stops them) or killed
    (SIGKILL: requests in flight are cut) and started again on the same ports while the
    producers write: they reconnect by themselves, and what they resend is stored once (the
    brokers' idempotence sees the same sequence)."""
    proxy_process.workers = workers
    proxy_process.start()
    topic = spread_topic(healthy)
    producers = [
        ConfluentNumbered(proxy_process.bootstrap, topic, PARTITIONS, "librdkafka"),
        PythonNumbered(proxy_process.bootstrap, topic, PARTITIONS, "kafka-python"),
    ]
    with streaming(producers):
        wait_for_acks(producers, 0, ACKS_PER_PHASE, "before the restart")
        code = proxy_process.stop(how)
        proxy_process.start()
        for partition in range(PARTITIONS):
            wait_for_acks(producers, partition, ACKS_PER_PHASE, "after kvproxy came back")
    assert code == (0 if how == signal.SIGTERM else -signal.SIGKILL)

    tally = tally_of(producers, read_back(proxy_process.bootstrap, topic, PARTITIONS))
    print_tally(f"kvproxy (workers: {workers}) restarted ({how.name}) mid-stream", tally)
    assert (tally.lost, tally.duplicated, tally.failed) == (0, 0, 0), tally
    assert_clients_saw_only(proxy_process, producers, healthy)


def test_kvproxy_restarted_while_its_first_bootstrap_broker_is_down(
    healthy: KafkaCluster, proxy_process: ProxyProcess
) -> None:
    """Broker 1 (the first of kvproxy's bootstrap servers) killed, kvproxy restarted while it is
    down, then broker 1 started again and made leader of its partition once more: the restarted
    kvproxy starts from the brokers that answer and opens broker 1's listener when it returns."""
    proxy_process.start()
    topic = spread_topic(healthy)
    partition = next(p for p in range(PARTITIONS) if healthy.leader_of(topic, p) == 1)
    producers = [
        ConfluentNumbered(proxy_process.bootstrap, topic, PARTITIONS, "librdkafka"),
        PythonNumbered(proxy_process.bootstrap, topic, PARTITIONS, "kafka-python"),
    ]
    with streaming(producers):
        wait_for_acks(producers, partition, ACKS_PER_PHASE, "before the kill")
        healthy.node(1).kill()
        new_leader(healthy, topic, partition, 1)
        proxy_process.stop(signal.SIGTERM)
        proxy_process.start()
        wait_for_acks(producers, partition, ACKS_PER_PHASE, "through the restarted kvproxy")
        healthy.restart(1)
        lead_again(healthy, topic, partition, 1)
        wait_for_acks(producers, partition, ACKS_PER_PHASE, "from broker 1, leader again")

    tally = tally_of(producers, read_back(proxy_process.bootstrap, topic, PARTITIONS))
    print_tally("kvproxy restarted while broker 1 is down", tally)
    assert (tally.lost, tally.duplicated, tally.failed) == (0, 0, 0), tally
    assert_clients_saw_only(proxy_process, producers, healthy)
