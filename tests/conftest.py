"""Shared fixtures.

Broker fixtures (tests using them are marked ``broker`` automatically):

* ``tansu`` (session): a running Tansu broker on a free 127.0.0.1 port; yields
  ``Broker(host, port, bootstrap)``. Shared by the whole session: do not restart it. For a broker
  of your own (restarts, a different advertised address) use ``tests.harness.run_tansu()``.
* ``make_topic`` (function): ``make_topic(partitions=1, config=None, prefix="t") -> name``
  creates a fresh uniquely named topic on ``tansu`` via CreateTopics.
* ``topic`` (function): a fresh uniquely named topic with one partition.
* ``raw_client`` (function): a ``RawKafkaClient`` connected to ``tansu``; closed afterwards.
* ``spark`` (session, tests/pipeline): a local[2] SparkSession; tests using it are marked
  ``spark`` and run on one xdist worker (``--dist loadgroup``).
* ``kafka`` (session): Apache Kafka 4.x (:data:`tests.harness.kafka_broker.KAFKA_4`), one KRaft
  combined node (node id 1); yields a ``KafkaCluster`` (``.bootstrap``, ``.create_topic()``,
  ``.leader_of()``, ``.tool()``). ``kafka3``: the same with Kafka 3.9
  (:data:`~tests.harness.kafka_broker.KAFKA_3`, which still takes Produce v0-v2 and magic 0/1).
  ``any_kafka``: parametrised over both. Tests using them are marked ``kafka``. For a cluster of
  your own (three brokers, kills, security settings) use ``run_kafka()``.
* ``proxy`` (function): kvproxy in front of ``tansu`` (``tests.harness.proxy.RunningProxy``:
  ``.bootstrap``, ``.stats()``, ``.broker_port(node_id)``, ``.wait_until_idle()``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.harness import (
    Broker,
    RawKafkaClient,
    create_topic,
    run_tansu,
    unique_topic_name,
)
from tests.harness.kafka_broker import KAFKA_3, KAFKA_4, KAFKA_VERSIONS, KafkaCluster, run_kafka
from tests.harness.proxy import RunningProxy, run_proxy

BROKER_FIXTURES = {"tansu", "topic", "make_topic", "raw_client", "proxy"}
KAFKA_FIXTURES = {"kafka", "kafka3", "any_kafka"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if BROKER_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.broker)
        if KAFKA_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.kafka)
        if "spark" in fixtures:
            # One SparkSession (one JVM) per worker: keep every Spark test on the same one.
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture(scope="session")
def tansu() -> Iterator[Broker]:
    with run_tansu() as server:
        yield server.broker


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaCluster]:
    """Apache Kafka 4.x, one KRaft combined node, shared by the session (do not stop it)."""
    with run_kafka(KAFKA_4) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def kafka3() -> Iterator[KafkaCluster]:
    """Apache Kafka 3.9, one KRaft combined node, shared by the session (do not stop it)."""
    with run_kafka(KAFKA_3) as cluster:
        yield cluster


@pytest.fixture(params=KAFKA_VERSIONS, ids=lambda version: f"kafka-{version}")
def any_kafka(request: pytest.FixtureRequest) -> KafkaCluster:
    """Each tested Kafka version in turn (the session's ``kafka`` and ``kafka3``)."""
    name = "kafka" if request.param == KAFKA_4 else "kafka3"
    cluster: KafkaCluster = request.getfixturevalue(name)
    return cluster


@pytest.fixture
def make_topic(tansu: Broker) -> Callable[..., str]:
    def _make(partitions: int = 1, config: dict[str, str] | None = None, prefix: str = "t") -> str:
        return create_topic(tansu.bootstrap, unique_topic_name(prefix), partitions, config)

    return _make


@pytest.fixture
def topic(make_topic: Callable[..., str]) -> str:
    return make_topic()


@pytest.fixture
def raw_client(tansu: Broker) -> Iterator[RawKafkaClient]:
    client = RawKafkaClient(tansu.host, tansu.port)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def proxy(tansu: Broker) -> Iterator[RunningProxy]:
    """kvproxy in front of the session's Tansu broker (node 111), on free loopback ports."""
    with run_proxy(tansu.bootstrap) as running:
        yield running
