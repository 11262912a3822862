"""Kafka Connect 4.4.0 (a distributed worker) through kvproxy in front of Apache Kafka 4.4.0.

One worker for the module (`tests/harness/kafka_connect.py`), whose `bootstrap.servers` is the
proxy and which runs every source task exactly-once (KIP-618). It creates its compacted internal
topics through kvproxy and keeps its configs, offsets and statuses there under the default checks;
a source connector's records are read back by a read_committed consumer and reach a sink
connector. Then a record the topic's policy refuses: what the REST status, the worker's log and
a consumer show (docs/clients.md, "Kafka Connect", quotes them).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, IsolationLevel, KafkaError, TopicPartition
from confluent_kafka.admin import ConfigResource, OffsetSpec
from kio.schema.create_topics.v7.response import CreateTopicsResponse
from kio.schema.response_header.v1.header import ResponseHeader
from kio.serial import entity_reader

from tests.harness.kafka_broker import KafkaCluster
from tests.harness.kafka_connect import (
    SINK_CONNECTOR,
    SOURCE_CONNECTOR,
    ConnectWorker,
    run_connect_worker,
    task_states,
)
from tests.harness.proxy import RunningProxy, run_proxy

DOC = Path(__file__).resolve().parents[2] / "docs" / "clients.md"
CREATE_TOPICS = 19
INIT_PRODUCER_ID = 22
END_TXN = 26
KEYS = "order-[0-9]+"
ORDERS = [(f"order-{n}", f'{{"n": {n}}}') for n in range(5)]
REFUSED = [("order-1", "v1", 0), ("order-2", "v2", 0), ("bad key", "v3", 1), ("order-4", "v4", 0)]
"""One poll of the source, so one transaction: three records to partition 0, the second key
(to partition 1) does not match KEYS."""

# One worker runs the module: one proxy, one Connect JVM.
pytestmark = [pytest.mark.kafka, pytest.mark.xdist_group("kafka_connect")]


@dataclass
class Stage:
    kafka: KafkaCluster
    proxy: RunningProxy
    worker: ConnectWorker
    orders: str
    refused: dict[str, str]
    """A topic with the `key_pattern` policy per `errors.tolerance` tried, and one for a restart."""
    sink_file: Path


def lines(records: list[tuple[Any, ...]]) -> str:
    return "\n".join("\t".join(map(str, record)) for record in records)


@pytest.fixture(scope="module")
def stage(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    orders = kafka.create_topic()
    refused = {
        tolerance: kafka.create_topic(partitions=2) for tolerance in ("none", "all", "restart")
    }
    rules = [{"match": t, "policies": [{"key_pattern": {"regex": KEYS}}]} for t in refused.values()]
    directory = tmp_path_factory.mktemp("connect")
    with (
        run_proxy(kafka.bootstrap_servers, topics=rules) as proxy,
        run_connect_worker(proxy.bootstrap, directory) as worker,
    ):
        sink_file = directory / "sink.jsonl"
        worker.put_connector("orders-source", source_config(orders, lines(ORDERS)))
        worker.put_connector(
            "orders-sink",
            {"connector.class": SINK_CONNECTOR, "topics": orders, "file": str(sink_file)},
        )
        yield Stage(kafka, proxy, worker, orders, refused, sink_file)


def source_config(topic: str, records: str, **more: str) -> dict[str, str]:
    return {
        "connector.class": SOURCE_CONNECTOR,
        "tasks.max": "1",
        "topic": topic,
        "records": records,
        "exactly.once.support": "required",
        **more,
    }


def running(status: Any) -> bool:
    return status["connector"]["state"] == "RUNNING" and task_states(status) == ["RUNNING"]


def read(
    bootstrap: str, topic: str, partitions: int = 1, isolation: str = "read_committed"
) -> tuple[list[tuple[int, Any, Any]], dict[int, int]]:
    """Every record of the topic, (partition, key, value), and the offset each partition ended
    at for this isolation level (the last stable offset for read_committed): read until each
    partition reports its end, within 30 s."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    records: list[tuple[int, Any, Any]] = []
    ends: dict[int, int] = {}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + 30
        while len(ends) < partitions and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                ends[message.partition()] = message.offset()
            elif error is None:
                ends.pop(message.partition(), None)
                key, value = (
                    b if b is None else b.decode() for b in (message.key(), message.value())
                )
                records.append((message.partition(), key, value))
    finally:
        consumer.close()
    assert len(ends) == partitions, f"{topic} ({isolation}): no end reached; {ends}"
    return records, ends


def compacted(kafka: KafkaCluster, topic: str) -> bool:
    admin = kafka.admin()  # kept while the future is pending: a dropped client cancels it
    [future] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return bool(future.result(30)["cleanup.policy"].value == "compact")


def created_through(proxy: RunningProxy) -> set[tuple[str, int]]:
    """(topic, error code) of every CreateTopics v7 answer the proxy sent (the worker's admin
    client's version; decoded with kio, as kvproxy relays CreateTopics undecoded)."""
    created = set()
    for key, version, frame in list(proxy.responses):
        if (key, version) == (CREATE_TOPICS, 7):
            data = memoryview(bytes(frame))
            _, offset = entity_reader(ResponseHeader)(data, 0)
            answer, _ = entity_reader(CreateTopicsResponse)(data, offset)
            for topic in answer.topics:
                created.add((str(topic.name), int(topic.error_code)))
    return created


def documented(text: str) -> None:
    assert text in DOC.read_text(), text


# ---- the worker's own topics ------------------------------------------------------------------


def test_worker_keeps_configs_and_statuses_in_its_compacted_topics(stage: Stage) -> None:
    """The worker created its three topics through kvproxy (CreateTopics), compacted; the
    connectors' configs and statuses it wrote there (keyed records, which the default checks let
    through to a compacted topic) are what the REST API answers."""
    worker = stage.worker
    status = worker.wait_for_status("orders-source", running)
    assert status["type"] == "source"
    assert running(worker.wait_for_status("orders-sink", running))
    code, config = worker.request("GET", "/connectors/orders-source/config")
    assert code == 200
    assert config == {"name": "orders-source", **source_config(stage.orders, lines(ORDERS))}
    assert {(topic, 0) for topic in worker.topics.values()} <= created_through(stage.proxy)
    for topic in worker.topics.values():
        assert compacted(stage.kafka, topic), topic

    stored, _ = read(stage.proxy.bootstrap, worker.topics["config"])
    configs = {key: value and json.loads(value) for _, key, value in stored}
    assert configs["connector-orders-source"]["properties"] == config
    assert configs["task-orders-source-0"]["properties"]["records"] == lines(ORDERS)
    assert configs["commit-orders-source"] == {"tasks": 1}
    statuses, _ = read(stage.proxy.bootstrap, worker.topics["status"])
    latest = {key: json.loads(value) for _, key, value in statuses}
    assert latest["status-connector-orders-source"]["state"] == "RUNNING"
    assert latest["status-task-orders-source-0"]["state"] == "RUNNING"
    assert latest["status-task-orders-sink-0"]["state"] == "RUNNING"
    # nothing went wrong on the way: the worker warned of nothing (the refusals come later)
    assert not re.search(r"^\[[^]]+\] (WARN|ERROR) ", worker.log(), re.MULTILINE), worker.log()


# ---- exactly-once source, sink ---------------------------------------------------------------


def test_source_records_read_committed_once(stage: Stage) -> None:
    """One transaction (the poll's five records and the source offset) committed through
    kvproxy: a read_committed consumer reads each record once, the offsets topic has the
    source's position in the same transaction."""
    stage.worker.wait_for_status("orders-source", running)
    deadline = time.monotonic() + 30
    while True:
        records, ends = read(stage.proxy.bootstrap, stage.orders)
        if records or time.monotonic() > deadline:
            break
    assert records == [(0, key, value) for key, value in ORDERS]
    assert ends == {0: len(ORDERS) + 1}  # the commit marker after them
    answered = {key for key, _, _ in stage.proxy.responses}
    assert {INIT_PRODUCER_ID, END_TXN} <= answered
    offsets, _ = read(stage.proxy.bootstrap, stage.worker.topics["offset"])
    positions = {key: json.loads(value) for _, key, value in offsets}
    assert positions['["orders-source",{"source":"kvproxy"}]'] == {"next": len(ORDERS)}


def test_sink_receives_the_records(stage: Stage) -> None:
    deadline = time.monotonic() + 60
    received: list[dict[str, Any]] = []
    while len(received) < len(ORDERS) and time.monotonic() < deadline:
        if stage.sink_file.exists():
            received = [json.loads(line) for line in stage.sink_file.read_text().splitlines()]
        time.sleep(0.2)
    assert received == [
        {"topic": stage.orders, "partition": 0, "offset": n, "key": key, "value": value}
        for n, (key, value) in enumerate(ORDERS)
    ]


# ---- a refused record -------------------------------------------------------------------------


@pytest.mark.parametrize("tolerance", ["none", "all"])
def test_refused_record_fails_the_task_and_aborts_its_transaction(
    stage: Stage, tolerance: str
) -> None:
    """The refusal fails the exactly-once task, whatever `errors.tolerance` says (it covers
    converters and transforms; an exactly-once task fails on any send error), and the worker
    aborts the transaction: the partition-0 records kvproxy let through are stored but aborted."""
    topic = stage.refused[tolerance]
    name = f"refused-{tolerance}"
    worker = stage.worker
    more = {"errors.tolerance": tolerance, "errors.log.enable": "true"}
    worker.put_connector(name, source_config(topic, lines(REFUSED), **more))
    status = worker.wait_for_status(name, lambda s: task_states(s) == ["FAILED"])

    assert status["connector"]["state"] == "RUNNING"  # only the task fails
    [task] = status["tasks"]
    trace = task["trace"].splitlines()
    record_error = f"Record key 'bad key' does not match {KEYS} in topic partition {topic}-1"
    caused = (
        "Caused by: org.apache.kafka.common.InvalidRecordException: One or more records have "
        "been rejected due to 1 record errors in total, and only showing the first three errors "
        f"at most: [RecordError(batchIndex=0, message='{record_error}')]"
    )
    first = (
        "org.apache.kafka.connect.errors.ConnectException: Failed to flush offsets and/or "
        f"records for task {name}-0"
    )
    # When the refusal reached the producer before the task wrote its source offset into the
    # transaction, that write is refused at once, unwrapped: the commit never runs.
    in_error = (
        "org.apache.kafka.common.KafkaException: Cannot execute transactional method because we "
        "are in an error state"
    )
    assert trace[0] in (first, in_error), trace[0]
    assert trace[-1] == caused
    commit_frame = (
        "\tat org.apache.kafka.connect.runtime.ExactlyOnceWorkerSourceTask.commitTransaction("
    )
    assert any(line.startswith(commit_frame) for line in trace), trace
    committed = trace[0] == first
    if committed:
        assert trace[2].startswith(commit_frame)
    documented(first.replace(name, "refused-none"))
    documented(in_error)
    documented(caused.replace(topic, "refused"))

    expected = [
        rf"ERROR ExactlyOnceWorkerSourceTask\{{id={name}-0\}} failed to send record to {topic}:  "
        r"\(org\.apache\.kafka\.connect\.runtime\.AbstractWorkerSourceTask\)"
        rf"\norg\.apache\.kafka\.common\.InvalidRecordException: {re.escape(record_error)}\n",
        rf"ERROR ExactlyOnceWorkerSourceTask\{{id={name}-0\}} Task threw an uncaught and "
        r"unrecoverable exception\. Task is being killed and will not recover until manually "
        r"restarted ",
        rf"INFO \[Producer clientId=connector-producer-{name}-0, transactionalId="
        rf"{worker.group_id}-{name}-0\] Aborting incomplete transaction due to shutdown ",
    ]
    if committed:
        expected.append(
            rf"ERROR ExactlyOnceWorkerSourceTask\{{id={name}-0\}} Failed to commit producer "
            r"transaction "
        )
    log = worker.wait_for_log(expected)
    for line in log.splitlines():  # the lines docs/clients.md quotes, with its names
        shown = re.sub(r"^\[[^]]+\] ", "", line)
        if shown.startswith((f"ERROR ExactlyOnceWorkerSourceTask{{id={name}-0}}", "org.")) and (
            f"{topic}" in shown or f"{name}-0" in shown
        ):
            documented(shown.replace(topic, "refused").replace(name, "refused-none"))

    admin = stage.kafka.admin()
    stable, deadline = -1, time.monotonic() + 30
    while stable != 4 and time.monotonic() < deadline:  # the abort marker, written after the log
        answer = admin.list_offsets(
            {TopicPartition(topic, 0): OffsetSpec.latest()},
            isolation_level=IsolationLevel.READ_COMMITTED,
        )
        stable = next(iter(answer.values())).result(30).offset
        time.sleep(0.1)
    assert stable == 4
    committed, committed_ends = read(stage.proxy.bootstrap, topic, 2)
    uncommitted, ends = read(stage.proxy.bootstrap, topic, 2, "read_uncommitted")
    assert committed == []
    assert uncommitted == [(p, k, v) for k, v, p in REFUSED if p == 0]
    assert ends == {0: 4, 1: 0}  # three records and the abort marker; nothing on partition 1
    assert committed_ends == ends  # no transaction left open
    # the source offset was not committed either: a restarted task sends all four again
    offsets, _ = read(stage.proxy.bootstrap, worker.topics["offset"])
    assert not [key for _, key, _ in offsets if key.startswith(f'["{name}"')]


def test_restarted_task_is_refused_again(stage: Stage) -> None:
    """Its source offset was never committed, so the restarted task sends the same transaction
    again: refused and aborted again, the task FAILED again."""
    name = "refused-restart"
    topic = stage.refused["restart"]
    worker = stage.worker
    worker.put_connector(name, source_config(topic, lines(REFUSED)))
    worker.wait_for_status(name, lambda s: task_states(s) == ["FAILED"])
    failed_send = f"ERROR ExactlyOnceWorkerSourceTask{{id={name}-0}} failed to send record"
    assert worker.log().count(failed_send) == 1
    before = 1
    code, _ = worker.request("POST", f"/connectors/{name}/tasks/0/restart")
    assert code == 204
    deadline = time.monotonic() + 60
    while worker.log().count(failed_send) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert worker.log().count(failed_send) == before + 1
    worker.wait_for_status(name, lambda s: task_states(s) == ["FAILED"])
    committed, _ = read(stage.proxy.bootstrap, topic, 2)
    uncommitted, ends = read(stage.proxy.bootstrap, topic, 2, "read_uncommitted")
    assert committed == []
    assert uncommitted == [(p, k, v) for k, v, p in REFUSED * 2 if p == 0]
    assert ends == {0: 8, 1: 0}  # twice three records and an abort marker


def test_a_worker_in_front_of_kafka_3_9(
    kafka3: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The same worker (4.4.0) through kvproxy in front of Kafka 3.9.2: its internal topics
    made and compacted, the exactly-once source's records read_committed once."""
    topic = kafka3.create_topic()
    directory = tmp_path_factory.mktemp("connect-3.9")
    with (
        run_proxy(kafka3.bootstrap_servers) as proxy,
        run_connect_worker(proxy.bootstrap, directory) as worker,
    ):
        worker.put_connector("orders-3-9", source_config(topic, lines(ORDERS)))
        assert running(worker.wait_for_status("orders-3-9", running))
        deadline = time.monotonic() + 30
        while True:
            records, ends = read(proxy.bootstrap, topic)
            if records or time.monotonic() > deadline:
                break
        assert records == [(0, key, value) for key, value in ORDERS]
        assert ends == {0: len(ORDERS) + 1}  # the commit marker after them
        for internal in worker.topics.values():
            assert compacted(kafka3, internal), internal
