"""The same raw Produce requests sent straight to Apache Kafka and through kvproxy (default
checks) in front of that broker: the same answers, on every Produce version both accept, on
Kafka 4.x and 3.9, but for the differences docs/policies.md documents ("Differences from Apache
Kafka"), which `tests.harness.differential.KNOWN_DIFFERENCES` lists: a new difference fails, and
so does a documented one that is gone.

Inputs: every Produce of the Kafka test port (tests/unit/test_kafka_parity.py), the fuzz
corpus's Produce requests and corrupt batches (tests/harness/differential_cases.py), each to a
real topic made with its settings, which the proxy learns with DescribeConfigs.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.harness.differential import Producers, Route, create_topics, run_cases, unexplained
from tests.harness.differential_cases import Case, all_cases
from tests.harness.kafka_broker import KAFKA_3, KAFKA_4, KafkaCluster, run_kafka
from tests.harness.proxy import run_proxy
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import topic_id_of

PRODUCE_VERSIONS = {KAFKA_4: range(3, 14), KAFKA_3: range(12)}
"""What both accept: 4.x refuses v0-v2 (KIP-896) and takes v3-v13 (v13: topics by id); 3.9
takes v0-v11."""


SHARDS = 4
"""Pairs of connections (direct, through the proxy) the cases are spread over."""


@dataclass
class Setup:
    topics: dict[tuple[tuple[str, str], ...], str]
    routes: list[tuple[Route, Route]]
    producers: Producers
    topic_ids: dict[str, uuid.UUID]
    """Each topic's id (Produce v13), asked of the broker directly: the proxy learns them by
    asking the cluster itself, as for a client that learned an id elsewhere."""


# Its own brokers (started once), so the whole module stays on one xdist worker.
pytestmark = [pytest.mark.kafka, pytest.mark.xdist_group("kafka_differential")]


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    return all_cases(tmp_path_factory.mktemp("differential"))


@pytest.fixture(scope="module")
def setups(cases: list[Case]) -> Iterator[Callable[[str], Setup]]:
    """Per Kafka version (made on first use): a broker, a topic per case settings, a proxy in
    front."""
    made: dict[str, Setup] = {}
    with contextlib.ExitStack() as stack:

        def setup(version: str) -> Setup:
            if version not in made:
                # A broker of its own: how Kafka answers a transactional batch outside a
                # transaction depends on what other tests' producers did on a shared one.
                cluster: KafkaCluster = stack.enter_context(run_kafka(version))
                settings = sorted({case.settings for case in cases})
                if version == KAFKA_4:  # removed in 4.0 (KIP-1030)
                    drop = "message.timestamp.difference.max.ms"
                    configs = [{k: v for k, v in s if k != drop} for s in settings]
                else:
                    configs = [dict(s) for s in settings]
                topics = dict(zip(settings, create_topics(cluster, configs), strict=True))
                proxy = stack.enter_context(run_proxy(cluster.bootstrap_servers))
                routes = [
                    (
                        Route("direct", cluster.host, cluster.port),
                        Route("proxy", proxy.host, proxy.port),
                    )
                    for _ in range(SHARDS)
                ]
                for pair in routes:
                    for route in pair:
                        stack.callback(route.close)
                with RawKafkaClient(cluster.host, cluster.port) as client:
                    ids = {name: topic_id_of(client, name) for name in topics.values()}
                made[version] = Setup(topics, routes, Producers(), ids)
            return made[version]

        yield setup


@pytest.mark.parametrize("kafka_version", [KAFKA_4, KAFKA_3])
def test_produce_versions_both_accept(kafka_version: str, setups: Callable[[str], Setup]) -> None:
    """The versions the differential runs are those the broker and the proxy both offer (4.x
    offers v0-v13 but refuses v0-v2)."""
    setup = setups(kafka_version)
    low, high = setup.routes[0][0].produce_versions()
    proxy_low, proxy_high = setup.routes[0][1].produce_versions()
    if kafka_version == KAFKA_4:
        assert (low, high, proxy_high) == (0, 13, 13)
    wanted = PRODUCE_VERSIONS[kafka_version]
    assert (max(low, proxy_low, wanted[0]), min(high, proxy_high)) == (wanted[0], wanted[-1])


@pytest.mark.parametrize(
    ("kafka_version", "produce_version"),
    [(kafka, version) for kafka, versions in PRODUCE_VERSIONS.items() for version in versions],
    ids=lambda value: f"kafka-{value}" if isinstance(value, str) else f"v{value}",
)
def test_same_answers_direct_and_through_the_proxy(
    kafka_version: str,
    produce_version: int,
    cases: list[Case],
    setups: Callable[[str], Setup],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.CRITICAL, logger="kvproxy")  # a line per refusal otherwise
    setup = setups(kafka_version)
    outcomes = run_cases(
        cases,
        produce_version,
        setup.topics,
        setup.routes,
        setup.producers,
        topic_ids=setup.topic_ids,
    )
    assert len(outcomes) == len(cases)
    problems = unexplained(outcomes, kafka_version, produce_version)
    identical = sum(outcome.same for outcome in outcomes)
    print(
        f"Kafka {kafka_version} Produce v{produce_version}: {len(outcomes)} cases, "
        f"{identical} identical, {len(outcomes) - identical} documented differences"
    )
    assert not problems, "\n".join(problems)


def test_an_unknown_topic_id_is_answered_as_kafka_answers_it(
    setups: Callable[[str], Setup],
) -> None:
    """Produce v13 naming an id no topic has: Kafka answers UNKNOWN_TOPIC_ID, no message, no
    offsets; so does the proxy, which asked the cluster before answering."""
    from tests.harness.engine import batch
    from tests.harness.fuzz import produce_request

    setup = setups(KAFKA_4)
    nobody = uuid.uuid4()
    answers = []
    for route in setup.routes[0]:
        answer = route.send(
            lambda c: produce_request(13, c, [(nobody, 0, batch(b"v"))]), 13, -1, 10
        )
        answers.append(answer)
    direct, proxied = answers
    assert direct.code == 100  # UNKNOWN_TOPIC_ID
    assert proxied == direct
