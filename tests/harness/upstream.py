"""The broker behind a test, whichever it is: Tansu (fast, one node, validates nothing) or Apache
Kafka (the real answers). A module runs on both with ``pytestmark = pytest.mark.upstreams("tansu",
"kafka")`` and the ``upstream`` fixture (see tests/conftest.py); a test that is about one of them
narrows it with its own ``@pytest.mark.upstreams("tansu")`` and says why."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from tests.harness.kafka_broker import KafkaCluster
from tests.harness.tansu import Broker, create_topic, unique_topic_name

__all__ = ["KAFKA_NODE_ID", "TANSU_NODE_ID", "UPSTREAMS", "Upstream"]

UPSTREAMS = ("tansu", "kafka")
TANSU_NODE_ID = 111  # Tansu's own default node id
KAFKA_NODE_ID = 1  # the session's single combined KRaft node


@dataclass(frozen=True)
class Upstream:
    """Where the broker is (``host``, ``port``, ``bootstrap`` as :class:`Broker` has them), its
    node id, and which broker it is (``name``; ``kafka`` is the :class:`KafkaCluster`)."""

    name: str
    host: str
    port: int
    bootstrap: str
    node_id: int
    kafka: KafkaCluster | None = None

    @classmethod
    def of_tansu(cls, broker: Broker) -> Upstream:
        return cls("tansu", broker.host, broker.port, broker.bootstrap, TANSU_NODE_ID)

    @classmethod
    def of_kafka(cls, cluster: KafkaCluster) -> Upstream:
        node = cluster.brokers[0].node_id
        return cls("kafka", cluster.host, cluster.port, cluster.bootstrap, node, cluster)

    @property
    def is_kafka(self) -> bool:
        return self.kafka is not None

    @property
    def is_tansu(self) -> bool:
        return self.kafka is None

    def create_topic(
        self,
        partitions: int = 1,
        config: Mapping[str, str] | None = None,
        prefix: str = "t",
        *,
        name: str | None = None,
    ) -> str:
        """A topic (`name`, or a fresh unique one); on Kafka, returned once every partition's
        leader answers (Metadata names the leader a moment before it takes Produce)."""
        name = name or unique_topic_name(prefix)
        if self.kafka is None:
            return create_topic(self.bootstrap, name, partitions, dict(config) if config else None)
        self.kafka.create_topic(name, partitions, config)
        _wait_for_leaders(self.bootstrap, name, partitions)
        return name


def _wait_for_leaders(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> None:
    """Until each partition's leader answers ListOffsets (asked, with a deadline)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kvproxy-tests-unused"})
    deadline = time.monotonic() + timeout
    try:
        for partition in range(partitions):
            while True:
                try:
                    consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)
                    break
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
    finally:
        consumer.close()
