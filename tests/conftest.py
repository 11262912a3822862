"""Shared fixtures.

Broker fixtures (tests on Tansu are marked ``broker``, tests on Apache Kafka ``kafka``,
automatically):

* ``tansu`` (session): a running Tansu broker on a free 127.0.0.1 port; yields
  ``Broker(host, port, bootstrap)``. Shared by the whole session: do not restart it. For a broker
  of your own (restarts, a different advertised address) use ``tests.harness.run_tansu()``.
* ``kafka`` (session): Apache Kafka 4.x (:data:`tests.harness.kafka_broker.KAFKA_4`), one KRaft
  combined node (node id 1); yields a ``KafkaCluster`` (``.bootstrap``, ``.create_topic()``,
  ``.leader_of()``, ``.tool()``). ``kafka3``: the same with Kafka 3.9
  (:data:`~tests.harness.kafka_broker.KAFKA_3`, which still takes Produce v0-v2 and magic 0/1).
  ``any_kafka``: parametrised over both. For a cluster of your own (three brokers, kills,
  security settings) use ``run_kafka()``. Each session broker starts once per xdist worker, on
  first use.
* ``upstream`` (session): the broker behind the test, a ``tests.harness.upstream.Upstream``
  (``.name``, ``.host``, ``.port``, ``.bootstrap``, ``.node_id``, ``.is_kafka``, ``.kafka``,
  ``.create_topic()``): the session's Tansu unless the module or test says otherwise with
  ``pytest.mark.upstreams("tansu", "kafka")``, which runs each test once per named broker (ids
  ``[tansu]`` and ``[kafka]``, Kafka being the session's ``kafka``). A mark on a test overrides
  the module's: ``@pytest.mark.upstreams("tansu")`` keeps one test on Tansu (say why).
* ``make_topic`` (function): ``make_topic(partitions=1, config=None, prefix="t") -> name``
  creates a fresh uniquely named topic on ``upstream`` via CreateTopics.
* ``topic`` (function): a fresh uniquely named topic with one partition on ``upstream``.
* ``raw_client`` (function): a ``RawKafkaClient`` connected to ``upstream``; closed afterwards.
* ``proxy`` (function): kvproxy in front of ``upstream`` (``tests.harness.proxy.RunningProxy``:
  ``.bootstrap``, ``.stats()``, ``.broker_port(node_id)`` with ``upstream.node_id``,
  ``.wait_until_idle()``).
* ``spark`` (session, tests/pipeline): a local[2] SparkSession; tests using it are marked
  ``spark`` and run on one xdist worker (``--dist loadgroup``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from kvproxy.proxy.ops.log_limits import start_afresh
from tests.harness import Broker, RawKafkaClient, process_groups, run_tansu
from tests.harness.kafka_broker import KAFKA_3, KAFKA_4, KAFKA_VERSIONS, KafkaCluster, run_kafka
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.upstream import UPSTREAMS, Upstream

BROKER_FIXTURES = {"tansu", "topic", "make_topic", "raw_client", "proxy", "upstream"}
KAFKA_FIXTURES = {"kafka", "kafka3", "any_kafka"}


def pytest_configure(config: pytest.Config) -> None:
    # Brokers and kvproxy run in sessions of their own: killed on SIGTERM/SIGINT/SIGHUP too, and
    # in an xdist worker as soon as its controller is gone (tests/harness/process_groups.py).
    worker = hasattr(config, "workerinput") or "PYTEST_XDIST_WORKER" in os.environ
    process_groups.install(watch_parent=worker)
    config.addinivalue_line(
        "markers",
        "upstreams(*names): run the test once per named broker behind ``upstream`` "
        f"(of {', '.join(UPSTREAMS)}); a test's mark overrides its module's",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "upstream" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("upstreams")
    if marker is None:
        return
    names = list(marker.args)
    unknown = [name for name in names if name not in UPSTREAMS]
    if not names or unknown:
        raise pytest.UsageError(f"upstreams{tuple(names)}: name brokers of {UPSTREAMS}")
    metafunc.parametrize("upstream", names, indirect=True, ids=names)


def _upstream_of(item: pytest.Item) -> str | None:
    """The broker behind ``upstream`` for this item (Tansu when not parametrised)."""
    if "upstream" not in getattr(item, "fixturenames", ()):
        return None
    callspec = getattr(item, "callspec", None)
    return str(callspec.params.get("upstream", "tansu")) if callspec else "tansu"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        upstream = _upstream_of(item)
        if (
            "tansu" in fixtures
            or upstream == "tansu"
            or (upstream is None and BROKER_FIXTURES.intersection(fixtures))
        ):
            item.add_marker(pytest.mark.broker)
        if KAFKA_FIXTURES.intersection(fixtures) or upstream == "kafka":
            item.add_marker(pytest.mark.kafka)
        if "spark" in fixtures:
            # One SparkSession (one JVM) per worker: keep every Spark test on the same one.
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture(autouse=True)
def _fresh_log_limits() -> None:
    """Each test's proxies start with the peer-caused log lines' windows unspent (they are per
    process: a test before this one in the same worker may have spent them)."""
    start_afresh()


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


@pytest.fixture(scope="session")
def upstream(request: pytest.FixtureRequest) -> Upstream:
    """The session broker this test runs against (``upstreams`` mark; Tansu by default). Session
    scope, so a module-scoped fixture may build on it; the brokers themselves start once."""
    name = getattr(request, "param", "tansu")
    if name == "kafka":
        return Upstream.of_kafka(request.getfixturevalue("kafka"))
    return Upstream.of_tansu(request.getfixturevalue("tansu"))


@pytest.fixture
def make_topic(upstream: Upstream) -> Callable[..., str]:
    def _make(partitions: int = 1, config: dict[str, str] | None = None, prefix: str = "t") -> str:
        return upstream.create_topic(partitions, config, prefix)

    return _make


@pytest.fixture
def topic(make_topic: Callable[..., str]) -> str:
    return make_topic()


@pytest.fixture
def raw_client(upstream: Upstream) -> Iterator[RawKafkaClient]:
    client = RawKafkaClient(upstream.host, upstream.port)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def proxy(upstream: Upstream) -> Iterator[RunningProxy]:
    """kvproxy in front of ``upstream``, on free loopback ports."""
    with run_proxy(upstream.bootstrap) as running:
        yield running
