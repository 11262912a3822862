"""`kvproxy audit` over the log directory of a real Apache Kafka broker, while the broker runs
(its active segments open and being written) and after it stopped. The audit must count the same
data batches, records and transaction markers as Kafka's own kafka-dump-log, and find the one
record a `json` policy refuses, at its offset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from tests.harness.audit import audit, write_config
from tests.harness.dump_log import kafka_dump
from tests.harness.kafka_broker import KAFKA_4, KafkaCluster, run_kafka

ORDERS = [b'{"id": 1}', b'{"id": 2}', b"not json", b'{"id": 4}', b"[]"]
BAD_OFFSET = 2


def fill(cluster: KafkaCluster) -> dict[str, str]:
    """An `orders` topic with one value that is not JSON, a gzip topic, and a transactional
    topic with a committed and an aborted transaction: kind -> folder name."""
    orders = cluster.create_topic("orders")
    compressed = cluster.create_topic()
    transactional = cluster.create_topic()
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "compression.type": "gzip", "linger.ms": 5}
    )
    for value in ORDERS:
        producer.produce(orders, key=b"order", value=value)
    for i in range(30):
        producer.produce(compressed, key=b"k%d" % (i % 3), value=b"v%d" % i)
        if i % 10 == 9:
            assert producer.flush(30) == 0
    assert producer.flush(30) == 0
    txn = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "audit-kafka"})
    txn.init_transactions(60)
    for commit in (True, False):
        txn.begin_transaction()
        for i in range(3):
            txn.produce(transactional, key=b"t%d" % i, value=b"%d" % i)
        assert txn.flush(30) == 0
        (txn.commit_transaction if commit else txn.abort_transaction)(60)
    return {"orders": f"{orders}-0", "gzip": f"{compressed}-0", "txn": f"{transactional}-0"}


def dump_counts(cluster: KafkaCluster, folder: Path) -> tuple[int, int, int]:
    """(data batches, their records, control batches) as kafka-dump-log reads the folder."""
    dumped = kafka_dump(cluster, sorted(folder.glob("*.log")))
    batches = [batch for name in dumped for batch in dumped[name]]
    data = [b for b in batches if not b.control]
    return len(data), sum(len(b.records) for b in data), len(batches) - len(data)


def check(summary: dict[str, Any], rows: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    assert summary["errors"] == []
    for folder, (batches, records, control) in expected.items():
        partition = summary["partitions"][folder]
        found = (partition["data_batches"], partition["records"], partition["control_batches"])
        assert found == (batches, records, control), folder
    assert [(r["topic"], r["offset"], r["policy"], r["error_code"]) for r in rows] == [
        ("orders", BAD_OFFSET, "json", 87)
    ]
    assert summary["violations"] == 1


def test_audit_of_a_kafka_log_directory_running_and_stopped(spark: Any, tmp_path: Path) -> None:
    config = write_config(
        tmp_path, "topics:\n  - {match: orders, default_policies: drop, policies: [json]}\n"
    )
    with run_kafka(KAFKA_4, directory=tmp_path / "kafka") as cluster:
        folders = fill(cluster)
        data = cluster.node(1).directory / "data"
        expected = {name: dump_counts(cluster, data / name) for name in folders.values()}
        assert expected[folders["txn"]] == (2, 6, 2)  # the aborted records stay in the log
        assert expected[folders["orders"]][1] == len(ORDERS)

        running = tmp_path / "running"
        running.mkdir()
        check(*audit(spark, running, inputs=(str(data),), config=config), expected)

        cluster.node(1).stop()
        assert not cluster.node(1).running
        stopped = tmp_path / "stopped"
        stopped.mkdir()
        check(*audit(spark, stopped, inputs=(str(data),), config=config), expected)
