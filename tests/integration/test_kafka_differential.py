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
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.harness.differential import Producers, Route, run_cases, unexplained
from tests.harness.differential_cases import Case, all_cases
from tests.harness.kafka_broker import KAFKA_3, KAFKA_4, KafkaCluster
from tests.harness.proxy import run_proxy

PRODUCE_VERSIONS = {KAFKA_4: range(3, 13), KAFKA_3: range(12)}
"""What both accept: 4.x refuses v0-v2 (KIP-896) and kvproxy offers up to v12; 3.9 takes
v0-v11."""


@dataclass
class Setup:
    topics: dict[tuple[tuple[str, str], ...], str]
    direct: Route
    proxied: Route
    producers: Producers


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    return all_cases(tmp_path_factory.mktemp("differential"))


@pytest.fixture(scope="module")
def setups(request: pytest.FixtureRequest, cases: list[Case]) -> Iterator[Callable[[str], Setup]]:
    """Per Kafka version (made on first use): a topic per case settings, a proxy in front."""
    made: dict[str, Setup] = {}
    with contextlib.ExitStack() as stack:

        def setup(version: str) -> Setup:
            if version not in made:
                cluster: KafkaCluster = request.getfixturevalue(
                    "kafka" if version == KAFKA_4 else "kafka3"
                )
                topics = {}
                for settings in sorted({case.settings for case in cases}):
                    config = dict(settings)
                    if version == KAFKA_4:  # removed in 4.0 (KIP-1030)
                        config.pop("message.timestamp.difference.max.ms", None)
                    topics[settings] = cluster.create_topic(config=config)
                proxy = stack.enter_context(run_proxy(cluster.bootstrap_servers))
                direct = Route("direct", cluster.host, cluster.port)
                proxied = Route("proxy", proxy.host, proxy.port)
                stack.callback(direct.close)
                stack.callback(proxied.close)
                made[version] = Setup(topics, direct, proxied, Producers())
            return made[version]

        yield setup


@pytest.mark.parametrize("kafka_version", [KAFKA_4, KAFKA_3])
def test_produce_versions_both_accept(kafka_version: str, setups: Callable[[str], Setup]) -> None:
    """The versions the differential runs are those the broker and the proxy both offer (4.x
    offers v0-v13 but refuses v0-v2)."""
    setup = setups(kafka_version)
    low, high = setup.direct.produce_versions()
    proxy_low, proxy_high = setup.proxied.produce_versions()
    if kafka_version == KAFKA_4:
        assert (low, high, proxy_high) == (0, 13, 12)
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
        [setup.direct, setup.proxied],
        setup.producers,
    )
    assert len(outcomes) == len(cases)
    problems = unexplained(outcomes, kafka_version, produce_version)
    identical = sum(outcome.same for outcome in outcomes)
    print(
        f"Kafka {kafka_version} Produce v{produce_version}: {len(outcomes)} cases, "
        f"{identical} identical, {len(outcomes) - identical} documented differences"
    )
    assert not problems, "\n".join(problems)
