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
from tests.harness.proxy import RunningProxy, run_proxy

BROKER_FIXTURES = {"tansu", "topic", "make_topic", "raw_client", "proxy"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if BROKER_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.broker)
        if "spark" in fixtures:
            # One SparkSession (one JVM) per worker: keep every Spark test on the same one.
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture(scope="session")
def tansu() -> Iterator[Broker]:
    with run_tansu() as server:
        yield server.broker


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
