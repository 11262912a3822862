"""What each real client tells its user when kvproxy refuses a record (docs/clients.md).

One kvproxy in front of the broker (Tansu, then Apache Kafka: the clients see the same) serves
the document's topics: `customers` (compacted: a null key is refused with INVALID_RECORD),
`orders` (the `json` policy: INVALID_RECORD), `payments` (a custom policy: POLICY_VIOLATION) and
`events` (default policies: a bad CRC is CORRUPT_MESSAGE).
confluent-kafka, kcat, kafka-python and aiokafka each produce the same records, and the exact
exception type and text each client gives is asserted, together with the Produce version it used.
The last test refuses one record on `invoices` (`json`) and reads the reason back from the proxy's
log line (text and JSON), its metrics and `kvproxy quarantine show`. Every quoted
string must appear verbatim in docs/clients.md, after the run's random topic names, ports, times
and CRC values are replaced by the ones the document shows.

No client library builds a batch with a bad CRC. To see what a client does with
CORRUPT_MESSAGE, the proxy advertises 127.0.0.2 and a relay on 127.0.0.2 (same port numbers)
forwards every connection to the proxy on 127.0.0.1, flipping one bit of any request that
carries the marker `flip-me` (it becomes `flip-md`): a bit flipped in transit, inside the bytes
the batch CRC covers. Everything else passes through the relay unchanged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvproxy.protocol.messages import PRODUCE
from kvproxy.proxy.ops.logs import TEXT_FORMAT, JsonFormatter
from tests.harness.clients import LINGER_MS
from tests.harness.flipping_relay import MARK, PROXY_HOST, RELAY_HOST, FlippingRelay
from tests.harness.kcat import run_kcat
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.upstream import Upstream

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "clients.md"
KVPROXY = [sys.executable, "-m", "kvproxy.cli"]

pytestmark = pytest.mark.upstreams("tansu", "kafka")


CURRENCY = {
    "custom": {"class": "examples.policies:CurrencyPolicy", "config": {"allowed": ["EUR", "USD"]}}
}
GBP = b'{"amount": 5, "currency": "GBP"}'
NOT_JSON = b"not json"
GOOD_JSON = b'{"n": 1}'

# What the document shows in place of the values that change from run to run.
DOC_CRC = "stored crc = 2618552119"
DOC_PORT = "127.0.0.1:51234"
DOC_TEXT_TIME = "2026-11-22 10:00:00,123"
DOC_JSON_TIME = "2026-11-22T10:00:00.123Z"
DOC_ENTRY_ID = "4f9c2a61d2b84c0e9a57be1f03c6d7e2"


# ---- the stage: topics, proxy, relays, captured log records ----


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Stage:
    proxy: RunningProxy
    topics: dict[str, str]
    """Document name (customers, orders, payments, events, invoices) -> this run's topic."""
    journal: Path
    log: _Records

    @property
    def bootstrap(self) -> str:
        return self.proxy.bootstrap  # 127.0.0.2: through the relay

    def produce_versions(self, since: int) -> set[int]:
        return {v for key, v, _ in list(self.proxy.responses)[since:] if key == PRODUCE}

    def rejections(self, doc_name: str) -> int:
        topic = self.topics[doc_name]
        return sum(n for (t, _, _), n in self.proxy.server.sink.rejections.items() if t == topic)

    def normalise(self, text: str) -> str:
        """`text` with this run's topic names, CRC values, ports and times as the doc shows them."""
        for doc_name, topic in self.topics.items():
            text = text.replace(topic, doc_name)
        text = re.sub(r"stored crc = \d+", DOC_CRC, text)
        text = re.sub(r"127\.0\.0\.1:\d+", DOC_PORT, text)
        text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", DOC_TEXT_TIME, text)
        text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", DOC_JSON_TIME, text)
        return re.sub(r"\b[0-9a-f]{32}\b", DOC_ENTRY_ID, text)

    def assert_in_doc(self, *texts: str) -> None:
        doc = DOC.read_text()
        for text in texts:
            shown = self.normalise(text)
            assert shown in doc, f"docs/clients.md does not quote:\n{shown}"


@pytest.fixture(scope="module")
def stage(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    def topic(prefix: str, config: dict[str, str] | None = None) -> str:
        return upstream.create_topic(1, config, prefix)

    topics = {
        "customers": topic("customers", {"cleanup.policy": "compact"}),
        "orders": topic("orders"),
        "payments": topic("payments"),
        "events": topic("events"),
        "invoices": topic("invoices"),
    }
    rules = [
        {"match": topics["orders"], "default_policies": "drop", "policies": ["json"]},
        {"match": topics["invoices"], "default_policies": "drop", "policies": ["json"]},
        {
            "match": topics["payments"],
            "default_policies": "drop",
            "policies": ["batch_integrity", "crc", CURRENCY],
        },
    ]
    journal = tmp_path_factory.mktemp("journal")
    handler = _Records()
    rejection_log = logging.getLogger("kvproxy.rejections")
    rejection_log.addHandler(handler)
    try:
        with run_proxy(
            upstream.bootstrap,
            topics=rules,
            listen={"advertised_host": RELAY_HOST},
            quarantine={"dir": str(journal), "flush_interval_ms": 50},
        ) as proxy:
            relays = [
                FlippingRelay((RELAY_HOST, port), (PROXY_HOST, port))
                for port in (proxy.port, proxy.broker_port(upstream.node_id))
            ]
            try:
                yield Stage(proxy, topics, journal, handler)
            finally:
                for relay in relays:
                    relay.close()
    finally:
        rejection_log.removeHandler(handler)


# ---- confluent-kafka (librdkafka) ----


def confluent_errors(
    bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]], **conf: Any
) -> list[Any]:
    """Produce `records` (key, value) in one batch; the delivery report error of each."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": LINGER_MS,
            "message.timeout.ms": 5000,
            **conf,
        }
    )
    errors: dict[int, Any] = {}
    for n, (key, value) in enumerate(records):
        producer.produce(
            topic,
            value,
            key,
            partition=0,
            on_delivery=lambda error, _message, n=n: errors.__setitem__(n, error),
        )
    assert producer.flush(15) == 0
    return [errors[n] for n in range(len(records))]


def test_confluent_kafka(stage: Stage) -> None:
    from confluent_kafka import KafkaError

    start = len(stage.proxy.responses)
    orders, bootstrap = stage.topics["orders"], stage.bootstrap

    [null_key] = confluent_errors(bootstrap, stage.topics["customers"], [(None, b"no key")])
    one_bad = confluent_errors(
        bootstrap, orders, [(b"k", GOOD_JSON), (b"k", NOT_JSON), (b"k", GOOD_JSON)]
    )
    two_bad = confluent_errors(
        bootstrap,
        orders,
        [(b"k", GOOD_JSON), (b"k", NOT_JSON), (b"k", GOOD_JSON), (b"k", b"nah"), (b"k", GOOD_JSON)],
    )
    [policy] = confluent_errors(bootstrap, stage.topics["payments"], [(b"k", GBP)])
    before = stage.rejections("events")
    started = time.monotonic()
    [corrupt] = confluent_errors(
        bootstrap, stage.topics["events"], [(b"k", b"a " + MARK)], **{"message.timeout.ms": 1500}
    )
    waited = time.monotonic() - started

    invalid = (
        'KafkaError{code=INVALID_RECORD,val=87,str="Broker: Broker failed to validate record"}'
    )
    different = (
        "KafkaError{code=_INVALID_DIFFERENT_RECORD,val=-138,"
        'str="Local: an invalid record in the same batch caused the failure of this message too"}'
    )
    violation = 'KafkaError{code=POLICY_VIOLATION,val=44,str="Broker: Policy violation"}'
    timed_out = 'KafkaError{code=_MSG_TIMED_OUT,val=-192,str="Local: Message timed out"}'
    assert str(null_key) == invalid
    assert null_key.code() == KafkaError.INVALID_RECORD and not null_key.retriable()
    # one bad record: librdkafka reports INVALID_RECORD for every record of the batch
    assert [str(e) for e in one_bad] == [invalid] * 3
    # two bad records: the culprits get INVALID_RECORD, the others _INVALID_DIFFERENT_RECORD
    assert [str(e) for e in two_bad] == [different, invalid, different, invalid, different]
    assert str(policy) == violation
    # CORRUPT_MESSAGE is retried until message.timeout.ms, then the message times out
    assert str(corrupt) == timed_out
    assert waited >= 1.4
    assert stage.rejections("events") >= before + 2
    assert stage.produce_versions(start) == {10}
    stage.assert_in_doc(invalid, different, violation, timed_out, "| confluent-kafka | v10")


# ---- kcat (librdkafka) ----


def test_kcat(stage: Stage) -> None:
    """kcat on the librdkafka the confluent-kafka wheel bundles, then Debian 12's kcat as it is
    installed (librdkafka 2.0.2, older than KIP-467 support in librdkafka 2.4.0)."""

    def kcat(system: bool, topic: str, lines: bytes, *options: str) -> list[str]:
        args = ["-b", stage.bootstrap, "-P", "-t", stage.topics[topic], "-p", "0"]
        args += ["-X", f"linger.ms={LINGER_MS}", "-X", "message.timeout.ms=5000", *options]
        if system:
            done = subprocess.run(
                ["kcat", *args], input=lines, capture_output=True, timeout=20, check=False
            )
        else:
            done = run_kcat(args, input_bytes=lines, timeout=20)
        assert done.returncode == 1, done
        assert done.stdout == b""
        return done.stderr.decode().splitlines()

    batch = b"".join(b"k:" + value + b"\n" for value in (GOOD_JSON, NOT_JSON, GOOD_JSON))
    invalid = "% Delivery failed for message: Broker: Broker failed to validate record"
    violation = "% Delivery failed for message: Broker: Policy violation"
    seen = {}
    for system in (False, True):
        start = len(stage.proxy.responses)
        before = stage.rejections("events")
        assert kcat(system, "customers", b"no key\n") == [invalid]
        assert kcat(system, "orders", batch, "-K:") == [invalid] * 3
        assert kcat(system, "payments", GBP + b"\n") == [violation]
        [corrupt] = kcat(system, "events", b"a " + MARK + b"\n", "-X", "message.timeout.ms=1500")
        seen[system] = (corrupt, stage.rejections("events") - before, stage.produce_versions(start))

    # librdkafka 2.16 retries CORRUPT_MESSAGE until message.timeout.ms; 2.0.2 fails at once
    corrupt, attempts, versions = seen[False]
    assert corrupt == "% Delivery failed for message: Local: Message timed out"
    assert attempts >= 2 and versions == {10}
    old_corrupt, old_attempts, old_versions = seen[True]
    assert old_corrupt == "% Delivery failed for message: Broker: Invalid message"
    assert old_attempts == 1 and old_versions == {7}
    stage.assert_in_doc(
        invalid,
        violation,
        corrupt,
        old_corrupt,
        "| kcat (librdkafka 2.16.0) | v10",
        "| kcat (librdkafka 2.0.2) | v7",
    )


# ---- kafka-python ----


def kafka_python_outcomes(
    bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]], **conf: Any
) -> list[BaseException | None]:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=LINGER_MS,
        request_timeout_ms=5000,
        **conf,
    )
    outcomes: list[BaseException | None] = []
    try:
        futures = [producer.send(topic, key=k, value=v, partition=0) for k, v in records]
        producer.flush(15)  # sends at once: the linger only keeps the records in one batch
        for future in futures:
            try:
                future.get(timeout=15)
                outcomes.append(None)
            except Exception as exc:  # what the user gets is the point
                outcomes.append(exc)
    finally:
        producer.close(5)
    return outcomes


def test_kafka_python(stage: Stage, caplog: pytest.LogCaptureFixture) -> None:
    from kafka.errors import (
        CorruptRecordError,
        InvalidRecordError,
        KafkaError,
        PolicyViolationError,
    )

    start = len(stage.proxy.responses)
    bootstrap = stage.bootstrap
    [null_key] = kafka_python_outcomes(bootstrap, stage.topics["customers"], [(None, b"no key")])
    batch = kafka_python_outcomes(
        bootstrap, stage.topics["orders"], [(b"k", GOOD_JSON), (b"k", NOT_JSON), (b"k", GOOD_JSON)]
    )
    [policy] = kafka_python_outcomes(bootstrap, stage.topics["payments"], [(b"k", GBP)])
    before = stage.rejections("events")
    [corrupt] = kafka_python_outcomes(bootstrap, stage.topics["events"], [(b"k", b"a " + MARK)])

    assert type(null_key) is InvalidRecordError
    assert str(null_key) == (
        "[Error 87] InvalidRecordError: Compacted topic cannot accept message without key in "
        f"topic partition {stage.topics['customers']}-0"
    )
    first, bad, third = batch
    assert type(bad) is InvalidRecordError
    assert str(bad) == (
        "[Error 87] InvalidRecordError: Record value is not valid JSON (invalid literal, "
        f"expected 'null': line 1 column 1) in topic partition {stage.topics['orders']}-0"
    )
    other = (
        "KafkaError: Failed to append record because it was part of a batch which had one more "
        "more invalid records"
    )
    assert type(first) is KafkaError and type(third) is KafkaError
    assert str(first) == str(third) == other
    assert type(policy) is PolicyViolationError
    assert (
        str(policy)
        == "[Error 44] PolicyViolationError: currency GBP is not allowed; allowed: EUR, USD"
    )
    # CORRUPT_MESSAGE is not retriable for kafka-python: it fails at once, after one attempt
    assert type(corrupt) is CorruptRecordError
    assert re.fullmatch(
        rf"\[Error 2\] CorruptRecordError: Record is corrupt \(stored crc = \d+\) in topic "
        rf"partition {stage.topics['events']}-0\.",
        str(corrupt),
    ), str(corrupt)
    assert stage.rejections("events") == before + 1
    assert stage.produce_versions(start) == {9}
    # kafka-python also logs the partition's whole error_message, at WARNING
    [logged] = [
        r.getMessage()
        for r in caplog.records
        if r.name == "kafka.producer.producer_batch" and stage.topics["orders"] in r.getMessage()
    ]
    assert logged.startswith(
        "Failed to produce messages to topic-partition TopicPartition(topic="
        f"'{stage.topics['orders']}', partition=0) with base offset None: [Error 87] "
        "InvalidRecordError: One or more records have been rejected due to 1 record errors"
    ), logged
    stage.assert_in_doc(
        str(null_key), str(bad), other, str(policy), str(corrupt), logged, "| kafka-python | v9"
    )


# ---- aiokafka ----


async def aiokafka_outcomes(
    bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]]
) -> list[BaseException | None]:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=LINGER_MS, request_timeout_ms=5000
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, v, key=k, partition=0) for k, v in records]
        results = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        await producer.stop()
    return [r if isinstance(r, BaseException) else None for r in results]


async def test_aiokafka(stage: Stage, caplog: pytest.LogCaptureFixture) -> None:
    from aiokafka.errors import CorruptRecordException, PolicyViolationError, UnknownError

    start = len(stage.proxy.responses)
    bootstrap = stage.bootstrap
    [null_key] = await aiokafka_outcomes(bootstrap, stage.topics["customers"], [(None, b"no key")])
    batch = await aiokafka_outcomes(
        bootstrap, stage.topics["orders"], [(b"k", GOOD_JSON), (b"k", NOT_JSON), (b"k", GOOD_JSON)]
    )
    [policy] = await aiokafka_outcomes(bootstrap, stage.topics["payments"], [(b"k", GBP)])
    before = stage.rejections("events")
    [corrupt] = await aiokafka_outcomes(bootstrap, stage.topics["events"], [(b"k", b"a " + MARK)])

    # aiokafka has no class for INVALID_RECORD (87): UnknownError, errno -1, no message
    for error in (null_key, *batch):
        assert type(error) is UnknownError
        assert (str(error), repr(error)) == ("[Error -1] UnknownError", "UnknownError()")
    assert type(policy) is PolicyViolationError
    assert str(policy) == "[Error 44] PolicyViolationError"
    # CORRUPT_MESSAGE is not retriable for aiokafka either
    assert type(corrupt) is CorruptRecordException
    assert str(corrupt) == "[Error 2] CorruptRecordException"
    assert stage.rejections("events") == before + 1
    assert stage.produce_versions(start) == {7}
    # and it logs nothing about them
    assert not [r for r in caplog.records if r.name.startswith("aiokafka") and r.levelno >= 30]
    stage.assert_in_doc("[Error -1] UnknownError", str(policy), str(corrupt), "| aiokafka | v7")


# ---- the versions the document names ----


def test_the_document_names_the_client_versions(stage: Stage) -> None:
    import aiokafka
    import confluent_kafka
    import kafka

    def kcat_versions(system: bool) -> tuple[str, str]:
        out = (
            subprocess.run(["kcat", "-V"], capture_output=True, timeout=10, check=True).stdout
            if system
            else run_kcat(["-V"]).stdout
        )
        found = re.search(rb"Version (\S+) .*librdkafka (\S+)", out)
        assert found, out
        return found[1].decode(), found[2].decode()

    kcat_version, bundled = kcat_versions(False)
    system_kcat, system_librdkafka = kcat_versions(True)
    assert bundled == confluent_kafka.libversion()[0] and system_kcat == kcat_version
    stage.assert_in_doc(
        f"confluent-kafka {confluent_kafka.__version__} (librdkafka {bundled})",
        f"kcat {kcat_version} (on librdkafka {bundled}, and on\nDebian 12's librdkafka "
        f"{system_librdkafka})",
        f"kafka-python {kafka.__version__}, aiokafka {aiokafka.__version__}, and the Java client",
    )


# ---- where the reason is: log, metrics, quarantine ----


def _wait(condition: Callable[[], Any], what: str, timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return result


def test_the_full_reason_is_in_the_log_the_metrics_and_the_quarantine(stage: Stage) -> None:
    invoices = stage.topics["invoices"]
    [error] = confluent_errors(
        stage.bootstrap, invoices, [(b"inv-7", NOT_JSON)], **{"client.id": "billing"}
    )
    assert error is not None

    # the log line, as `kvproxy serve` writes it in each format
    [record] = [r for r in stage.log.records if getattr(r, "topic", None) == invoices]
    text_line = logging.Formatter(TEXT_FORMAT).format(record)
    json_line = JsonFormatter().format(record)
    fields = json.loads(json_line)
    assert fields["event"] == "rejection"
    assert (fields["policy"], fields["code"], fields["client_id"]) == ("json", 87, "billing")
    assert "Record value is not valid JSON" in fields["error_message"]

    # the metric
    with urllib.request.urlopen(stage.proxy.metrics_url + "/metrics", timeout=5) as answer:
        metrics = answer.read().decode()
    [metric] = [
        line
        for line in metrics.splitlines()
        if line.startswith("kvproxy_policy_rejections_total{") and invoices in line
    ]
    assert metric.endswith(" 1.0"), metric

    # the quarantine journal
    def show() -> str:
        done = subprocess.run(
            [*KVPROXY, "quarantine", "show", "--dir", str(stage.journal), "--topic", invoices],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,  # a hang guard: a CLI start under heavy load once took 30 s
            check=True,
        )
        return done.stdout if "policy json" in done.stdout else ""

    shown = _wait(show, "the quarantine entry").splitlines()
    assert len(shown) == 4, shown  # the entry, its client, its reason, its one record
    assert shown[0].endswith(f" rejected {invoices}-0")
    assert shown[1].startswith("  client billing at 127.0.0.1:") and shown[1].endswith(
        ", Produce v10"
    )
    assert shown[2].startswith("  policy json, code 87 INVALID_RECORD: One or more records")
    stage.assert_in_doc(text_line, json_line, metric, *shown)
