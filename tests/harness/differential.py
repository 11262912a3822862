"""The same raw Produce requests sent straight to Apache Kafka and through kvproxy in front of it,
and the two answers compared (tests/integration/test_kafka_differential.py).

Each case (`tests.harness.differential_cases`) goes to a real topic made with the case's settings
(compacted, timestamp bounds, max.message.bytes ...), once direct and once through the proxy, on
one Produce version. What is compared is what a client decodes for the partition: the error
code, `record_errors` (index and message) and `error_message` where Kafka puts one on the wire
(where Kafka sends null the proxy may say why: docs/clients.md). Two acceptances are the same
whatever their offsets; on acks=0 what is compared is whether the connection was closed.

So that the broker's clock sees a case's timestamps as the case meant them, they are moved by
(now - the case's clock) before sending, the CRC kept valid or kept stale as it was; producer
ids are renumbered per path and version, so that the direct and the proxied sends are different
producers to the broker. Messages are compared after the parts that name the moment or the log
are blanked: the range "[now - before, now + after]" (each side's now), "at offset N" (the log
end), and the producer ids (mapped back to the case's own).
"""

from __future__ import annotations

import re
import struct
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kvproxy.protocol.messages import PRODUCE, decode_response
from tests.harness.differential_cases import Case, adjust
from tests.harness.fuzz import produce_request
from tests.harness.raw_client import (
    RawClientError,
    RawKafkaClient,
    api_versions_v0_request,
    parse_api_versions_v0_response,
)

CLOSED = "connection closed"
SILENT = "no answer (acks=0), connection open"
NO_ANSWER = "no answer, connection open"
TRANSIENT = frozenset({5, 6, 7, 8})
"""LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, BROKER_NOT_AVAILABLE: a
broker too busy for a moment (a loaded machine), never an answer about the records. A case
answered so either way is sent again (both ways)."""
UNVERIFIED_TRANSACTION = frozenset({19, 49})
"""What Kafka answers a transactional batch whose partition it cannot verify in a transaction:
NOT_ENOUGH_REPLICAS while its transaction coordinator is not reachable yet, then
INVALID_PRODUCER_ID_MAPPING. When the two sends meet the coordinator in different states and get
one each, both answers are the broker's own (the proxy forwarded the batch): sent again."""


@dataclass(frozen=True)
class Answer:
    """One partition's answer as a client decodes it (or what happened to the connection)."""

    code: int | str
    error_message: str | None = None
    record_errors: tuple[tuple[int, str | None], ...] = ()

    def __str__(self) -> str:
        if isinstance(self.code, str):
            return self.code
        return f"{self.code} {self.error_message!r} {list(self.record_errors)}"


def same(direct: Answer, proxied: Answer) -> bool:
    """Whether a client could tell the two answers apart (see the module's docstring)."""
    if direct.code == 0 and proxied.code == 0:
        return True
    if direct.code != proxied.code or direct.record_errors != proxied.record_errors:
        return False
    return direct.error_message is None or direct.error_message == proxied.error_message


# ---- requests ---------------------------------------------------------------------------------


class Producers:
    """Producer ids renumbered: one new id per (case group, id, version, path)."""

    def __init__(self, first: int = 7_000_000_000) -> None:
        self._lock = threading.Lock()
        self._next = first
        self._ids: dict[tuple[str, int, int, str], int] = {}
        self.original: dict[int, int] = {}

    def renumber(self, group: str, producer_id: int, version: int, path: str) -> int:
        key = (group, producer_id, version, path)
        with self._lock:
            if key not in self._ids:
                self._ids[key] = self._next
                self.original[self._next] = producer_id
                self._next += 1
            return self._ids[key]


def _normalise(text: str | None, producers: Producers) -> str | None:
    if text is None:
        return None
    text = re.sub(r"within \[-?\d+, -?\d+\]", "within [now - before, now + after]", text)
    text = re.sub(r"at offset \d+", "at offset N", text)
    return re.sub(r"\b\d{10,}\b", lambda m: str(producers.original.get(int(m[0]), m[0])), text)


# ---- sending ----------------------------------------------------------------------------------


class Route:
    """One way to the broker (direct or through the proxy): a connection kept across cases and
    opened again when the other side closes it."""

    def __init__(self, name: str, host: str, port: int) -> None:
        self.name, self.host, self.port = name, host, port
        self._client: RawKafkaClient | None = None
        self._correlation = 0

    def produce_versions(self) -> tuple[int, int]:
        with RawKafkaClient(self.host, self.port) as client:
            _, code, apis = parse_api_versions_v0_response(
                client.request(api_versions_v0_request())
            )
        assert code == 0
        return apis[PRODUCE]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def send(self, frame_of: Any, version: int, acks: int, timeout: float) -> Answer:
        """Send the request `frame_of(correlation id)`; the partition's answer."""
        if self._client is None:
            self._client = RawKafkaClient(self.host, self.port)
        self._correlation += 1
        correlation = self._correlation
        try:
            self._client.send_frame(frame_of(correlation))
            if acks == 0:
                # Kafka answers nothing on acks=0, and closes the connection to say "refused":
                # a request behind it tells the two apart
                self._correlation += 1
                self._client.request(api_versions_v0_request(self._correlation), timeout=10)
                return Answer(SILENT)
            frame = self._client.recv_frame(timeout=timeout)
        except RawClientError as exc:
            self.close()
            return Answer(NO_ANSWER if "timed out" in str(exc) else CLOSED)
        except OSError:
            self.close()
            return Answer(CLOSED)
        assert struct.unpack_from(">i", frame)[0] == correlation
        body = decode_response(frame, PRODUCE, version).body
        ((partition,),) = [topic.partition_responses for topic in body.responses]
        return Answer(
            int(partition.error_code),
            getattr(partition, "error_message", None),
            tuple(
                (int(e.batch_index), e.batch_index_error_message)
                for e in getattr(partition, "record_errors", ())
            ),
        )


@dataclass(frozen=True)
class Outcome:
    case: str
    version: int
    direct: Answer
    proxied: Answer

    @property
    def same(self) -> bool:
        return same(self.direct, self.proxied)


def _frame(
    case: Case, version: int, topic: Any, path: Route, *, shift: int, producers: Producers
) -> Any:
    """The request of `case` for `path`, as a function of its correlation id (`topic`: its name,
    or from Produce v13 its id)."""
    records = case.records
    if records is not None:
        records = adjust(
            records, shift, lambda pid: producers.renumber(case.group, pid, version, path.name)
        )

    def frame_of(correlation: int) -> bytes:
        return produce_request(
            version,
            correlation,
            [(topic, 0, records)],
            acks=case.acks,
            transactional_id=case.transactional_id,
        )

    return frame_of


def _normalised(answer: Answer, producers: Producers) -> Answer:
    return Answer(
        answer.code,
        _normalise(answer.error_message, producers),
        tuple((i, _normalise(m, producers)) for i, m in answer.record_errors),
    )


def _run_shard(
    cases: Sequence[Case],
    version: int,
    topics: dict[tuple[tuple[str, str], ...], str],
    routes: tuple[Route, Route],
    producers: Producers,
    *,
    topic_ids: Mapping[str, uuid.UUID],
) -> list[Outcome]:
    outcomes = []
    for case in cases:
        topic: Any = topics[case.settings]
        if version >= 13:  # topics by id
            topic = topic_ids[topic]
        deadline = time.monotonic() + 30
        while True:
            now = int(time.time() * 1000)
            shift = 0 if case.clock_ms is None else now - case.clock_ms
            direct, proxied = (
                _normalised(
                    route.send(
                        _frame(case, version, topic, route, shift=shift, producers=producers),
                        version,
                        case.acks,
                        case.answer_timeout_s,
                    ),
                    producers,
                )
                for route in routes
            )
            busy = (
                direct.code in TRANSIENT
                or proxied.code in TRANSIENT
                or (
                    direct.code != proxied.code
                    and {direct.code, proxied.code} <= UNVERIFIED_TRANSACTION
                )
            )
            if not busy or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # the broker is busy: ask again, as a client retries
        outcomes.append(Outcome(case.name, version, direct, proxied))
    return outcomes


def run_cases(
    cases: Sequence[Case],
    version: int,
    topics: dict[tuple[tuple[str, str], ...], str],
    routes: Sequence[tuple[Route, Route]],
    producers: Producers,
    *,
    topic_ids: Mapping[str, uuid.UUID] | None = None,
) -> list[Outcome]:
    """Every case on Produce `version`, direct then through the proxy (from v13 each topic by
    its id in `topic_ids`, which the proxy asks the cluster about); the cases in as many
    shards as there are pairs of routes (each on its own connections, at once), a case group
    in one shard, in order."""
    groups = sorted({case.group for case in cases})
    shard_of = {group: i % len(routes) for i, group in enumerate(groups)}
    shards = [[case for case in cases if shard_of[case.group] == i] for i in range(len(routes))]
    with ThreadPoolExecutor(len(routes)) as pool:
        runs = [
            pool.submit(
                _run_shard, shard, version, topics, pair, producers, topic_ids=topic_ids or {}
            )
            for shard, pair in zip(shards, routes, strict=True)
        ]
        outcomes = [outcome for run in runs for outcome in run.result()]
    order = {case.name: i for i, case in enumerate(cases)}
    return sorted(outcomes, key=lambda outcome: order[outcome.case])


# ---- the documented differences (docs/policies.md, "Differences from Apache Kafka") ----------

ALL_VERSIONS = frozenset(range(14))
V3_PLUS = frozenset(range(3, 14))
LEGACY = frozenset(range(3))
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


@dataclass(frozen=True)
class Known:
    """A documented difference: on these Produce versions, each case named (or, with `cases`
    None, any case whose direct answer is one of `direct`) is answered `direct` by Kafka and
    `proxied` through kvproxy."""

    section: str
    """The heading of its entry in docs/policies.md."""
    cases: tuple[str, ...] | None
    direct: frozenset[int | str]
    proxied: int | str
    produce: frozenset[int] = ALL_VERSIONS
    kafka: frozenset[str] = frozenset({"4.4.0", "3.9.2"})

    def covers(self, outcome: Outcome, kafka: str) -> bool:
        return (
            kafka in self.kafka
            and outcome.version in self.produce
            and (self.cases is None or outcome.case in self.cases)
            and outcome.direct.code in self.direct
            and outcome.proxied.code == self.proxied
        )

    def expected(self, kafka: str, version: int) -> tuple[str, ...]:
        """The cases that must differ so on this run (none for a rule over any case)."""
        if self.cases is None or kafka not in self.kafka or version not in self.produce:
            return ()
        return self.cases


KNOWN_DIFFERENCES: tuple[Known, ...] = (
    Known(
        "Legacy codes on Produce v0-v2",
        None,
        direct=frozenset({87, 32}),
        proxied=2,
        produce=LEGACY,
    ),
    Known(
        "A transactional batch for a partition outside a transaction",
        (
            *(f"port/test_batch_without_records_not_allowed[{c}]#1" for c in CODECS[:4]),
            "port/test_control_records_not_allowed_from_clients#1",
            "made/control-txn",
        ),
        direct=frozenset({19, 49}),  # 49 once the broker has a transaction state topic
        proxied=87,
        produce=V3_PLUS,
    ),
    Known(
        "A transactional batch for a partition outside a transaction",
        ("port/test_batch_without_records_not_allowed[zstd]#1",),
        direct=frozenset({19, 49}),  # 49 once the broker has a transaction state topic
        proxied=87,
        produce=frozenset(range(7, 14)),
    ),
    Known(
        "A compressed payload that does not decompress",
        tuple(f"made/garbage-payload-{c}" for c in CODECS[1:4]),
        direct=frozenset({-1}),
        proxied=2,
    ),
    Known(
        "A compressed payload that does not decompress",
        ("made/garbage-payload-zstd",),
        direct=frozenset({-1}),
        proxied=2,
        produce=LEGACY | frozenset(range(7, 14)),
    ),
    Known(
        "Bytes after the last complete batch",
        ("made/trailing-bytes", "made/trailing-header"),
        direct=frozenset({0}),
        proxied=2,
    ),
    Known(
        "Bytes after the last complete batch",
        ("made/truncated", "made/length-long", "made/header-only", "mutated/9"),
        direct=frozenset({0}),
        proxied=2,
        produce=LEGACY,
        kafka=frozenset({"3.9.2"}),
    ),
    Known(
        "Null records",
        ("made/null-records",),
        direct=frozenset({NO_ANSWER}),
        proxied=87,
        produce=V3_PLUS,
    ),
    Known(
        "A compressed payload that does not decompress",
        ("made/length-20",),
        direct=frozenset({-1}),
        proxied=2,
        produce=LEGACY,
        kafka=frozenset({"3.9.2"}),
    ),
    Known(
        "An unknown compression codec id",
        ("mutated/34", "mutated/45"),
        direct=frozenset({87}),
        proxied=2,
        produce=V3_PLUS,
    ),
    Known(
        "An unknown compression codec id",
        ("mutated/34", "mutated/45"),
        direct=frozenset({-1}),
        proxied=2,
        produce=LEGACY,
        kafka=frozenset({"3.9.2"}),
    ),
    Known(
        "An unknown compression codec id",
        ("mutated/58",),
        direct=frozenset({53}),
        proxied=2,
    ),
    Known(
        "A batch length near 2^31",
        ("mutated/28",),
        direct=frozenset({-1}),
        proxied=87,
        produce=V3_PLUS,
    ),
    Known(
        "A batch length near 2^31",
        ("mutated/28",),
        direct=frozenset({-1}),
        proxied=2,
        produce=LEGACY,
        kafka=frozenset({"3.9.2"}),
    ),
    Known(
        "More records than limits.max_records_per_request",
        ("mutated/35",),
        direct=frozenset({87}),
        proxied=10,
    ),
    Known(
        "Timestamps near Long.MIN_VALUE",
        ("mutated/55",),
        direct=frozenset({0}),
        proxied=32,
        produce=V3_PLUS,
        kafka=frozenset({"3.9.2"}),
    ),
    Known(
        "Timestamps near Long.MIN_VALUE",
        ("mutated/55",),
        direct=frozenset({0}),
        proxied=2,
        produce=LEGACY,
        kafka=frozenset({"3.9.2"}),
    ),
)


def unexplained(outcomes: Sequence[Outcome], kafka: str, version: int) -> list[str]:
    """What the table does not account for on this run: a difference no entry covers, and an
    entry's case that did not differ as the entry says (fixed: remove it from the table)."""
    problems = []
    for outcome in outcomes:
        if not outcome.same and not any(k.covers(outcome, kafka) for k in KNOWN_DIFFERENCES):
            problems.append(
                f"new difference {outcome.case}: Kafka {outcome.direct} / kvproxy {outcome.proxied}"
            )
    by_case = {outcome.case: outcome for outcome in outcomes}
    for known in KNOWN_DIFFERENCES:
        in_scope = kafka in known.kafka and version in known.produce
        if known.cases is None and in_scope and not any(known.covers(o, kafka) for o in outcomes):
            problems.append(f"documented difference gone: {known.section} (no case shows it)")
        for case in known.expected(kafka, version):
            outcome = by_case.get(case)
            if outcome is None or outcome.same or not known.covers(outcome, kafka):
                seen = "not sent" if outcome is None else f"{outcome.direct} / {outcome.proxied}"
                problems.append(f"documented difference gone: {known.section}: {case} ({seen})")
    return problems


def create_topics(cluster: Any, configs: Sequence[dict[str, str]]) -> list[str]:
    """One topic per config, in one CreateTopics request; waits until each has a leader."""
    from confluent_kafka.admin import NewTopic

    names = [f"diff-{uuid.uuid4().hex[:10]}" for _ in configs]
    admin = cluster.admin()
    futures = admin.create_topics(
        [NewTopic(name, 1, 1, config=config) for name, config in zip(names, configs, strict=True)],
        operation_timeout=30,
        request_timeout=30,
    )
    for future in futures.values():
        future.result(30)
    deadline = time.monotonic() + 30
    while True:
        listed = admin.list_topics(timeout=10).topics
        if all(
            name in listed
            and listed[name].error is None
            and listed[name].partitions
            and listed[name].partitions[0].leader >= 0
            for name in names
        ):
            return names
        assert time.monotonic() < deadline, "topics without a leader"
        time.sleep(0.05)
