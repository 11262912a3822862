"""Share groups (KIP-932) through kvproxy: two members of one share group, each its own Java
`KafkaShareConsumer` (kafka-clients 4.4.0), consume a topic of three partitions on Apache Kafka
4.4 through the proxy's port per broker and through its SNI listener.

What a user sees: with implicit acknowledgement every record produced is delivered once, to one
of the members; with explicit acknowledgement a record the application releases is delivered
again (delivery count 2) and one it rejects is never delivered again, not even by the time an end
marker produced after everything was settled has been delivered on every partition; every
acknowledgement commit succeeds. The client only ever learns proxy addresses: the group's
coordinator is named by the proxy's address, no answer the proxy sent names the broker, and the
share traffic (ShareGroupHeartbeat, ShareFetch, ShareAcknowledge) is answered through the proxy.

Kafka 4.x brokers of the harness are formatted with `share.version=2` (share groups on); the
session's `kafka` broker serves every test here.
"""

from __future__ import annotations

import struct
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.java_client import SHARE_CONSUMER, JavaRun, run_java_client
from tests.harness.kafka_broker import HOST, KafkaCluster
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.proxy_process import ProxyProcess
from tests.harness.sni import (
    CERTIFICATE_NAMES,
    JAVA_IPV4,
    SniEndpoint,
    accepted_connections,
    running_sni_proxy,
)
from tests.harness.tls import make_tls_files

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

PARTITIONS = 3
MEMBERS = 2
SHARE_GROUP_HEARTBEAT, SHARE_FETCH, SHARE_ACKNOWLEDGE = 76, 78, 79
Deliveries = dict[tuple[int, int], list[tuple[str, int, str]]]
"""(partition, offset): each delivery's (value, delivery count, acknowledgement), in order."""


def values_of(partition: int, mode: str) -> list[str]:
    """Four plain values per partition; in explicit mode one to release and one to reject too."""
    plain = [f"p{partition}-{n}" for n in range(4)]
    if mode == "explicit":
        return [plain[0], f"release-p{partition}", plain[1], f"reject-p{partition}", *plain[2:]]
    return plain


def produce(settings: dict[str, str], topic: str, mode: str) -> dict[tuple[int, int], str]:
    """Produce every partition's values with confluent-kafka; (partition, offset): value."""
    from confluent_kafka import Producer

    producer = Producer({**settings, "acks": "all", "message.timeout.ms": 30000})
    stored: dict[tuple[int, int], str] = {}
    errors: list[Any] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(error)
        else:
            stored[message.partition(), message.offset()] = message.value().decode()

    for partition in range(PARTITIONS):
        for n, value in enumerate(values_of(partition, mode)):
            key = f"k{partition}-{n}".encode()
            producer.produce(topic, value.encode(), key, partition=partition, on_delivery=delivered)
    assert producer.flush(60) == 0
    assert errors == []
    return stored


def expected(stored: dict[tuple[int, int], str]) -> Deliveries:
    """What each stored record's deliveries must be: released ones twice, the rest once."""
    deliveries: Deliveries = {}
    for at, value in stored.items():
        if value.startswith("release-"):
            deliveries[at] = [(value, 1, "release"), (value, 2, "accept")]
        elif value.startswith("reject-"):
            deliveries[at] = [(value, 1, "reject")]
        else:
            deliveries[at] = [(value, 1, "accept")]
    return deliveries


def share(
    bootstrap: str,
    topic: str,
    mode: str,
    expect: int,
    *,
    props: dict[str, str] | None = None,
    jvm: tuple[str, ...] = (),
) -> JavaRun:
    """Two members of a fresh share group consume `topic` until `expect` records are settled."""
    return run_java_client(
        "share",
        bootstrap,
        main_class=SHARE_CONSUMER,
        props=props,
        jvm=jvm,
        topic=topic,
        group=f"share-{uuid.uuid4().hex[:8]}",
        members=MEMBERS,
        expect=expect,
        mode=mode,
        timeout_ms=90_000,
    )


def check_deliveries(run: JavaRun, stored: dict[tuple[int, int], str]) -> dict[str, Any]:
    """Every stored record delivered as `expected` says, the end markers after them, every
    acknowledgement committed, both members in the group and every partition assigned; the
    report."""
    result = run.result
    assert not result["timed_out"], f"{result}\n--- the client's log ---\n{run.log[-4000:]}"
    members = result["members"]
    assert [m["error"] for m in members] == [None] * MEMBERS, members
    got: Deliveries = {}
    markers: Counter[tuple[int, str, int, str]] = Counter()
    for member in members:
        for partition, offset, value, count, ack in member["records"]:
            if value.startswith("end-marker-"):
                markers[partition, value, count, ack] += 1
            else:
                got.setdefault((partition, offset), []).append((value, count, ack))
    # a released record may come back to the other member: in delivery order, not member order
    assert {at: sorted(each, key=lambda d: d[1]) for at, each in got.items()} == expected(stored)
    assert markers == Counter((p, f"end-marker-{p}", 1, "accept") for p in range(PARTITIONS))
    commits = [outcome for m in members for outcome in m["commits"]]
    assert commits and all(error is None for _partition, error in commits), commits
    callbacks = [outcome for m in members for outcome in m["callbacks"]]
    assert callbacks and all(error is None for _p, _n, error in callbacks), callbacks

    group = result["group"]
    assert group["state"] == "Stable"
    assert sorted(name for name, _ in group["members"]) == ["member-0", "member-1"]
    assigned = [p for _name, partitions in group["members"] for p in partitions]
    assert sorted(set(assigned)) == list(range(PARTITIONS)), group
    return result


def named(frame: bytes, port: int) -> bool:
    """Whether an answer names HOST:port the way broker addresses are written (host, then port
    as int32): Metadata, FindCoordinator, DescribeCluster and node_endpoints all do."""
    return HOST.encode() + struct.pack(">i", port) in frame


# ---- the port per broker ----


@pytest.fixture
def kafka_proxy(kafka: KafkaCluster) -> Iterator[RunningProxy]:
    with run_proxy(kafka.bootstrap) as running:
        yield running


@pytest.mark.parametrize("mode", ["implicit", "explicit"])
def test_share_group_members_consume_through_the_proxy(
    kafka: KafkaCluster, kafka_proxy: RunningProxy, mode: str
) -> None:
    proxy = kafka_proxy
    topic = kafka.create_topic(partitions=PARTITIONS)
    stored = produce({"bootstrap.servers": proxy.bootstrap}, topic, mode)

    result = check_deliveries(share(proxy.bootstrap, topic, mode, expect=len(stored)), stored)

    (node,) = (n.node_id for n in kafka.brokers)
    assert result["group"]["coordinator"] == [node, HOST, proxy.broker_port(node)]
    answered = {api for api, _version, _frame in proxy.responses}
    assert {SHARE_GROUP_HEARTBEAT, SHARE_FETCH, SHARE_ACKNOWLEDGE} <= answered, answered
    frames = [bytes(frame) for _api, _version, frame in proxy.responses]
    assert any(named(frame, proxy.broker_port(node)) for frame in frames)  # the check can see
    assert not any(named(frame, kafka.port) for frame in frames)


# ---- the SNI listener ----


@pytest.fixture(scope="module")
def sni_stage(
    kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ProxyProcess, SniEndpoint]]:
    directory: Path = tmp_path_factory.mktemp("share-sni")
    with (
        make_tls_files(directory / "tls", hostnames=CERTIFICATE_NAMES) as tls,
        running_sni_proxy(directory, kafka.bootstrap_servers, tls) as stage,
    ):
        yield stage


@pytest.mark.parametrize("mode", ["implicit", "explicit"])
def test_share_group_members_consume_through_the_sni_listener(
    kafka: KafkaCluster, sni_stage: tuple[ProxyProcess, SniEndpoint], mode: str
) -> None:
    proxy, sni = sni_stage
    topic = kafka.create_topic(partitions=PARTITIONS)
    stored = produce(sni.librdkafka(), topic, mode)
    before = accepted_connections(proxy)

    run = share(sni.bootstrap, topic, mode, expect=len(stored), props=sni.java(), jvm=JAVA_IPV4)

    result = check_deliveries(run, stored)
    (node,) = (n.node_id for n in kafka.brokers)
    host, port = sni.broker_address(node).rsplit(":", 1)
    assert result["group"]["coordinator"] == [node, host, int(port)]
    new = accepted_connections(proxy) - before
    # the members, the Admin client and the marker producer: every connection on the SNI port
    assert new[("sni", "bootstrap")] >= 1 and new[("sni", str(node))] >= MEMBERS, new
    assert {listener for listener, _node in new} == {"sni"}, new
