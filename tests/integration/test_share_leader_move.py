"""A share consumer through kvproxy while its partition's leader moves (Apache Kafka 4.4, three
brokers, the proxy's port per broker).

A broker names brokers in a ShareFetch or ShareAcknowledge answer only when the leader has moved:
a partition it no longer leads is answered NOT_LEADER_OR_FOLLOWER, with the current leader in
`current_leader` and its address in `node_endpoints`, which the share consumer connects to. So one
Java `KafkaShareConsumer` (kafka-clients 4.4.0) consumes a one-partition topic led by broker 1;
once it has settled the first records and is waiting for more, the partition's preferred replica
is changed (ReassignPartitionsCommand, same replicas in another order) and a preferred leader
election makes another broker lead it; then more records are produced.

What a user sees: the answer the client got names the new leader by the proxy's address (its
port for that node), never a broker's own port, and the consumer goes on: every record, those
produced after the move included, is delivered and accepted, every acknowledgement commit
succeeds.
"""

from __future__ import annotations

import contextlib
import json
import struct
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvproxy.protocol.messages import decode_response
from tests.harness.java_client import SHARE_CONSUMER, java_client_argv
from tests.harness.kafka_broker import HOST, KAFKA_4, KafkaCluster, run_kafka
from tests.harness.proxy import RunningProxy, run_proxy

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

SHARE_FETCH, SHARE_ACKNOWLEDGE = 78, 79
NOT_LEADER_OR_FOLLOWER = 6
BEFORE, AFTER = 6, 6
"""Records produced before the move and after it."""
BROKERS = (1, 2, 3)
MOVES = (2, 3, 1)
"""Where the leadership of the topic's partition (broker 1 first) is moved, one after another
until a broker answered the consumer with node_endpoints."""
REASSIGN = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"


def produce(bootstrap: str, topic: str, values: list[str]) -> dict[int, str]:
    """Produce `values` to partition 0 with confluent-kafka; offset: value."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    stored: dict[int, str] = {}

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        stored[message.offset()] = message.value().decode()

    for value in values:
        producer.produce(topic, value.encode(), partition=0, on_delivery=delivered)
    assert producer.flush(60) == 0
    assert sorted(stored.values()) == sorted(values)
    return stored


@contextlib.contextmanager
def share_consumer(bootstrap: str, topic: str, expect: int) -> Iterator[subprocess.Popen[str]]:
    """One member of a fresh share group consuming `topic` until `expect` records are settled
    (then the end marker), in the background."""
    argv = java_client_argv(
        "share",
        bootstrap,
        main_class=SHARE_CONSUMER,
        topic=topic,
        group=f"share-{uuid.uuid4().hex[:8]}",
        members=1,
        expect=expect,
        mode="implicit",
        timeout_ms=150_000,
    )
    with subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()


def answers(proxy: RunningProxy, api_key: int) -> list[tuple[int, Any]]:
    """(place in the tap, body) of every answer of `api_key` the proxy sent to a client so far."""
    sent = list(proxy.responses)
    return [
        (n, decode_response(frame, api, version).body)
        for n, (api, version, frame) in enumerate(sent)
        if api == api_key
    ]


def settled_before_the_move(proxy: RunningProxy) -> bool:
    """Whether ShareFetch answers handed the client every record produced before the move and a
    ShareAcknowledge answer without error came after the last of them (the consumer's commitSync
    of that batch): nothing is left in flight when the leader moves."""
    handing = [
        (n, int(batch.last_offset) - int(batch.first_offset) + 1)
        for n, body in answers(proxy, SHARE_FETCH)
        for topic in body.responses
        for partition in topic.partitions
        for batch in partition.acquired_records
    ]
    if sum(count for _n, count in handing) < BEFORE:
        return False
    last = max(n for n, _count in handing)
    return any(
        n > last
        and int(body.error_code) == 0
        and all(int(p.error_code) == 0 for t in body.responses for p in t.partitions)
        for n, body in answers(proxy, SHARE_ACKNOWLEDGE)
    )


def redirections(proxy: RunningProxy) -> list[tuple[int, Any]]:
    """(api key, body) of every ShareFetch and ShareAcknowledge answer naming nodes."""
    return [
        (api, body)
        for api in (SHARE_FETCH, SHARE_ACKNOWLEDGE)
        for _n, body in answers(proxy, api)
        if body.node_endpoints
    ]


def wait_until(condition: Callable[[], Any], timeout: float) -> bool:
    """Poll `condition` until it holds (True) or `timeout` seconds passed (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def move_leader(cluster: KafkaCluster, topic: str, to: int, directory: Path) -> None:
    """Make `to` the preferred replica of partition 0 (the same replicas in another order),
    then elect it leader."""
    from confluent_kafka import ElectionType, TopicPartition

    replicas = [to, *(n for n in BROKERS if n != to)]
    plan = directory / f"reassign-{to}.json"
    partitions = [{"topic": topic, "partition": 0, "replicas": replicas}]
    plan.write_text(json.dumps({"version": 1, "partitions": partitions}))
    done = cluster.tool(
        REASSIGN, "--bootstrap-server", cluster.bootstrap, "--execute",
        "--reassignment-json-file", str(plan),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    admin = cluster.admin()

    def elected() -> bool:
        with contextlib.suppress(Exception):  # the new order not yet known to the controller
            admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)]).result(10)
        return cluster.leader_of(topic, 0) == to

    assert wait_until(elected, 30), f"{to} does not lead"


def named(frame: bytes, port: int) -> bool:
    """Whether an answer names HOST:port the way broker addresses are written (host, then port
    as int32)."""
    return HOST.encode() + struct.pack(">i", port) in frame


def test_share_fetch_names_the_new_leader_by_its_proxy_address(tmp_path: Path) -> None:
    with run_kafka(KAFKA_4, brokers=3) as cluster, run_proxy(cluster.bootstrap_servers) as proxy:
        topic = cluster.create_topic(replicas_on=[BROKERS])
        assert cluster.leader_of(topic, 0) == 1
        stored = produce(proxy.bootstrap, topic, [f"before-{n}" for n in range(BEFORE)])
        with share_consumer(proxy.bootstrap, topic, expect=BEFORE + AFTER) as proc:
            ready = wait_until(
                lambda: proc.poll() is not None or settled_before_the_move(proxy), 90
            )
            assert ready and proc.poll() is None, (
                f"not settled before the move: {proc.communicate()}"
            )
            # the consumer now waits in ShareFetch on broker 1; another broker takes over
            moved_to: list[int] = []
            for leader in MOVES:  # the first move is answered so at once; the others: if not
                move_leader(cluster, topic, leader, tmp_path)
                moved_to.append(leader)
                if wait_until(lambda: redirections(proxy), 10):
                    break
            stored |= produce(proxy.bootstrap, topic, [f"after-{n}" for n in range(AFTER)])
            out, log = proc.communicate(timeout=90)
        frames = [bytes(frame) for _api, _version, frame in proxy.responses]
        broker_ports = {node.node_id: node.port for node in cluster.brokers}
        proxy_ports = {n: proxy.broker_port(n) for n in BROKERS}

    # the broker named the new leader, and the client was told the proxy's port for it
    redirected = redirections(proxy)
    assert redirected, "no ShareFetch or ShareAcknowledge answer named a node"
    for _api, body in redirected:
        moved = [p for t in body.responses for p in t.partitions if int(p.error_code)]
        assert [int(p.error_code) for p in moved] == [NOT_LEADER_OR_FOLLOWER], body
        leader = int(moved[0].current_leader.leader_id)
        assert leader in moved_to, (body, moved_to)
        endpoints = [(int(e.node_id), e.host, int(e.port)) for e in body.node_endpoints]
        assert endpoints == [(leader, HOST, proxy_ports[leader])], (body, broker_ports)
    assert any(named(frame, proxy_ports[2]) for frame in frames)  # the check can see
    assert not [n for n, port in broker_ports.items() if any(named(f, port) for f in frames)]

    # and the consumer went on: every record delivered once and accepted, commits succeeded
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"{out}\n{log[-4000:]}"
    result = json.loads(lines[-1])
    assert not result["timed_out"], f"{result}\n{log[-4000:]}"
    (member,) = result["members"]
    assert member["error"] is None, member
    delivered = [tuple(record) for record in member["records"]]
    assert sorted(delivered) == sorted(
        [(0, offset, value, 1, "accept") for offset, value in stored.items()]
        + [(0, BEFORE + AFTER, "end-marker-0", 1, "accept")]
    ), f"{delivered}\n{log[-4000:]}"
    assert member["commits"] and all(error is None for _p, error in member["commits"]), member
    assert member["callbacks"] and all(error is None for *_pn, error in member["callbacks"])
