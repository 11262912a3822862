"""`kvproxy quarantine replay` with the producers people run: idempotent (confluent-kafka,
kafka-python), KIP-467 (`ResilientProducer`) and transactional, in front of kvproxy and Tansu or
Apache Kafka.

Each test has the `json` policy refuse some values, relaxes the policy (a new config file), runs
replay twice and reads the topic straight from the broker: every refused record once, nothing
twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvproxy.journal import JournalReader, segment_name
from kvproxy.protocol.journal import encode_entry
from kvproxy.protocol.records import build_batch
from tests.harness.processes import kvproxy
from tests.harness.produce import JSON_ONLY, stored, stored_batches
from tests.harness.proxy import run_proxy
from tests.harness.quarantine import journal_settings, new_entry, relaxed_config, replay
from tests.harness.upstream import Upstream

GOOD = [b'{"n": 0}', b'{"n": 2}', b'{"n": 4}']
BAD = [b"bad 1", b"bad 3", b"bad 5"]
# The good ones first: after a refused batch an idempotent producer bumps its epoch, and Tansu
# answers the next batches PRODUCER_FENCED (a broker quirk this file does not test).
SENT = GOOD + BAD

pytestmark = pytest.mark.upstreams("tansu", "kafka")


def replay_twice(config: Path, topic: str, entries: int, records: int) -> tuple[str, str]:
    first = replay(config, topic)
    label = "1 record" if records == 1 else f"{records} records"
    assert f"{entries} replayed ({label}), 0 still failing, 0 replayed earlier" in first, first
    second = replay(config, topic)
    assert f"0 replayed (0 records), 0 still failing, {entries} replayed earlier" in second, second
    return first, second


def send_confluent_idempotent(bootstrap: str, topic: str) -> list[int | None]:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 0,
            "message.timeout.ms": 10_000,
        }
    )
    outcomes: list[int | None] = []
    for value in SENT:
        producer.produce(
            topic,
            value,
            key=b"k",
            partition=0,
            on_delivery=lambda error, _m: outcomes.append(None if error is None else error.code()),
        )
        assert producer.flush(15) == 0
    return outcomes


def send_kafka_python_idempotent(bootstrap: str, topic: str) -> list[int | None]:
    """kafka-python fails every later send after a refused batch (an abortable error for an
    idempotent producer), so each refusal is followed by a new producer, as an application
    would do."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    def new_producer() -> Any:
        return KafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=True,
            acks="all",
            linger_ms=0,
            request_timeout_ms=10_000,
        )

    outcomes: list[int | None] = []
    producer = new_producer()
    try:
        for value in SENT:
            future = producer.send(topic, value, key=b"k", partition=0)
            try:
                future.get(timeout=15)
                outcomes.append(None)
            except KafkaError as exc:
                outcomes.append(getattr(exc, "errno", -1))
                producer.close(timeout=5)
                producer = new_producer()
    finally:
        producer.close(timeout=5)
    return outcomes


def stored_rows(upstream: Upstream, topic: str) -> list[tuple[int, bool, list[bytes | None]]]:
    """Each data batch in partition 0 as the broker keeps it: producer id, transactional, values."""
    return [
        (batch.producer_id, batch.is_transactional, [r.value for r in batch.records()])
        for batch in stored_batches(upstream, topic)
        if not batch.is_control
    ]


@pytest.mark.parametrize(
    "send", [send_confluent_idempotent, send_kafka_python_idempotent], ids=["confluent", "kpy"]
)
def test_an_idempotent_producers_refused_records_are_replayed_once(
    send: Callable[[str, str], list[int | None]],
    upstream: Upstream,
    make_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    """The refused batches carry the producer's id, epoch and sequences; a broker refuses them
    from anyone else (or drops them as duplicates): replay writes them as its own producer."""
    topic = make_topic(1)
    journal_dir = tmp_path / "journal"
    with run_proxy(
        upstream.bootstrap,
        topics=[{"match": topic, **JSON_ONLY}],
        quarantine=journal_settings(journal_dir),
    ) as proxy:
        outcomes = send(proxy.bootstrap, topic)
        assert proxy.server.journal is not None and proxy.server.journal.flush(10)
    assert [o is None for o in outcomes] == [True] * 3 + [False] * 3, outcomes
    assert stored(upstream, topic) == GOOD
    entries = list(JournalReader(journal_dir).entries())
    assert len(entries) == 3, entries

    first, _ = replay_twice(relaxed_config(tmp_path, upstream, journal_dir), topic, 3, 3)
    for entry in entries:
        assert f"{entry.id} {topic}-0: passes now, 1 record replayed to" in first, first
    assert stored(upstream, topic) == GOOD + BAD
    replayed = [b for b in stored_rows(upstream, topic) if b[2][0] in BAD]
    assert replayed == [(-1, False, [value]) for value in BAD], "written as kvproxy's own"


async def test_a_kip_467_producers_innocent_records_are_not_replayed(
    upstream: Upstream, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """`ResilientProducer` resends the records of a refused batch that were not refused itself;
    replay writes only the refused ones, so each record is stored once."""
    from kvproxy.producer import ProduceFailedError
    from kvproxy.producer.resilient import ResilientProducer

    topic = make_topic(1)
    journal_dir = tmp_path / "journal"
    values = [
        f'{{"n": {i}}}'.encode() if i not in (2, 7) else f"bad {i}".encode() for i in range(10)
    ]
    with run_proxy(
        upstream.bootstrap,
        topics=[{"match": topic, **JSON_ONLY}],
        quarantine=journal_settings(journal_dir),
    ) as proxy:
        async with ResilientProducer(bootstrap_servers=proxy.bootstrap, linger_ms=200) as producer:
            futures = [await producer.send(topic, value, b"k", partition=0) for value in values]
            outcomes = await _gather(futures)
        assert proxy.server.journal is not None and proxy.server.journal.flush(10)
    refused = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, ProduceFailedError)]
    assert refused == [2, 7], outcomes
    innocent = [v for i, v in enumerate(values) if i not in (2, 7)]
    assert stored(upstream, topic) == innocent
    (entry,) = JournalReader(journal_dir).entries()
    assert entry.record_indexes == (2, 7)

    first, _ = replay_twice(relaxed_config(tmp_path, upstream, journal_dir), topic, 1, 2)
    assert f"{entry.id} {topic}-0: passes now, 2 records replayed to" in first, first
    assert stored(upstream, topic) == [*innocent, values[2], values[7]]


async def _gather(futures: list[Any]) -> list[Any]:
    import asyncio

    return list(await asyncio.gather(*futures, return_exceptions=True))


def test_all_records_replays_the_innocent_ones_too(
    upstream: Upstream, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """By default only the named records; `--all-records` the whole batch; an entry refused as a
    whole (no record indexes) or with indexes left out is replayed whole either way."""
    topic = make_topic(1)
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    rows = [(b"k", f"v{i}".encode(), None, None) for i in range(3)]
    named = new_entry(
        "rejected",
        topic,
        0,
        policy="x",
        code=87,
        records=build_batch(rows),
        record_indexes=(1,),
        produce_version=9,
    )
    whole = new_entry("rejected", topic, 0, policy="x", code=2, records=build_batch(rows))
    cut = new_entry(
        "rejected",
        topic,
        0,
        policy="x",
        code=87,
        records=build_batch(rows),
        record_indexes=(0,),
        record_indexes_omitted=1,
    )
    (journal_dir / segment_name(0)).write_bytes(
        b"".join(encode_entry(e.to_metadata(), e.records) for e in (named, whole, cut))
    )
    config = relaxed_config(tmp_path, upstream, journal_dir)
    first = replay(config, topic)
    assert f"{named.id} {topic}-0: passes now, 1 record replayed to" in first, first
    assert f"{whole.id} {topic}-0: passes now, 3 records replayed to" in first, first
    assert f"{cut.id} {topic}-0: passes now, 3 records replayed to" in first, first
    assert stored(upstream, topic) == [b"v1"] + [b"v0", b"v1", b"v2"] * 2

    again = make_topic(1)
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    moved = new_entry(
        "rejected", again, 0, policy="x", code=87, records=build_batch(rows), record_indexes=(1,)
    )
    (other_dir / segment_name(0)).write_bytes(encode_entry(moved.to_metadata(), moved.records))
    out = kvproxy(
        "quarantine",
        "replay",
        "-c",
        str(config),
        "--dir",
        str(other_dir),
        "--topic",
        again,
        "--all-records",
    ).stdout
    assert f"{moved.id} {again}-0: passes now, 3 records replayed to" in out, out
    assert stored(upstream, again) == [b"v0", b"v1", b"v2"]


def test_a_transactional_batch_is_replayed_outside_any_transaction(
    upstream: Upstream, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The transaction that carried a refused batch was aborted by its producer (a refused
    batch is an abortable error); replay writes the refused records as plain records and says
    so for each such entry."""
    from confluent_kafka import KafkaException, Producer

    topic = make_topic(1)
    journal_dir = tmp_path / "journal"
    with run_proxy(
        upstream.bootstrap,
        topics=[{"match": topic, **JSON_ONLY}],
        quarantine=journal_settings(journal_dir),
    ) as proxy:
        producer = Producer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "transactional.id": f"replay-{topic}",
                "linger.ms": 100,
                "message.timeout.ms": 10_000,
            }
        )
        producer.init_transactions(15)
        producer.begin_transaction()
        producer.produce(topic, b'{"n": 0}', key=b"k", partition=0)
        producer.produce(topic, b"bad 1", key=b"k", partition=0)
        with pytest.raises(KafkaException) as raised:
            producer.commit_transaction(15)
        assert raised.value.args[0].txn_requires_abort(), raised.value
        producer.abort_transaction(15)
        assert proxy.server.journal is not None and proxy.server.journal.flush(10)
    assert stored(upstream, topic) == []
    (entry,) = JournalReader(journal_dir).entries()
    assert entry.record_indexes == (1,)

    first, _ = replay_twice(relaxed_config(tmp_path, upstream, journal_dir), topic, 1, 1)
    assert (
        f"{entry.id} {topic}-0: written outside any transaction (the producer's transaction "
        "was aborted)" in first
    ), first
    assert stored(upstream, topic) == [b"bad 1"]
    assert stored_rows(upstream, topic) == [(-1, False, [b"bad 1"])]


def test_skip_stored_leaves_out_records_already_in_the_partition(
    upstream: Upstream, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A replay stopped between the broker's acknowledgement and the mark writes the entry again
    on the next run; with --skip-stored that run finds the records in the partition (same key,
    value, headers and timestamp) and writes only what is missing."""
    from confluent_kafka import Producer

    topic = make_topic(1)
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    now = int(time.time() * 1000)
    rows = [(b"k", f"v{i}".encode(), [("h", b"x")], now - 1000 + i) for i in range(4)]
    written_before = new_entry(
        "rejected", topic, 0, policy="x", code=87, records=build_batch(rows[:2])
    )
    (journal_dir / segment_name(0)).write_bytes(
        encode_entry(written_before.to_metadata(), written_before.records)
    )
    config = relaxed_config(tmp_path, upstream, journal_dir)
    replay(config, topic)
    (journal_dir / "replayed.ids").unlink()  # as if the run had stopped before marking it

    # The client sent v2 again itself (the same record, timestamp included); v3 it did not.
    partly = new_entry("rejected", topic, 0, policy="x", code=87, records=build_batch(rows[2:]))
    with (journal_dir / segment_name(0)).open("ab") as segment:
        segment.write(encode_entry(partly.to_metadata(), partly.records))
    producer = Producer({"bootstrap.servers": upstream.bootstrap})
    producer.produce(
        topic, b"v2", key=b"k", partition=0, headers=[("h", b"x")], timestamp=now - 998
    )
    assert producer.flush(10) == 0
    # Same key and value, another timestamp: a different record, not left out.
    producer.produce(topic, b"v3", key=b"k", partition=0, headers=[("h", b"x")], timestamp=now)
    assert producer.flush(10) == 0
    assert stored(upstream, topic) == [b"v0", b"v1", b"v2", b"v3"]

    out = replay(config, topic, "--skip-stored")
    assert (
        f"{written_before.id} {topic}-0: every record already stored, nothing written; "
        "marked replayed\n"
    ) in out, out
    assert f"{partly.id} {topic}-0: 1 of 2 records already stored, left out\n" in out, out
    assert f"{partly.id} {topic}-0: passes now, 1 record replayed to" in out, out
    assert "2 replayed (1 record), 0 still failing, 0 replayed earlier" in out, out
    assert stored(upstream, topic) == [b"v0", b"v1", b"v2", b"v3", b"v3"]
    assert sorted((journal_dir / "replayed.ids").read_text().split()) == sorted(
        [written_before.id, partly.id]
    )


def test_a_batch_journaled_again_by_a_client_retry_is_written_once(
    upstream: Upstream, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A client that retries a refused batch (a retriable answer: the legacy code of Produce
    v0-v2, or a connection lost before the answer) sends the same bytes, and each refusal is an
    entry. Replay writes them once, in this run and in a later one."""
    topic = make_topic(1)
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    records = build_batch([(b"k", b"bad", None, 1_700_000_000_000)])
    first, retry = (
        new_entry("rejected", topic, 0, policy="json", code=2, records=records, record_indexes=(0,))
        for _ in range(2)
    )
    other = new_entry(
        "rejected",
        topic,
        0,
        policy="json",
        code=2,
        records=build_batch([(b"k", b"bad", None, 1_700_000_000_001)]),
        record_indexes=(0,),
    )
    segment = journal_dir / segment_name(0)
    segment.write_bytes(
        b"".join(encode_entry(e.to_metadata(), e.records) for e in (first, retry, other))
    )
    config = relaxed_config(tmp_path, upstream, journal_dir)
    out = replay(config, topic)
    assert f"{first.id} {topic}-0: passes now, 1 record replayed to" in out, out
    assert f"{retry.id} {topic}-0: the same records as entry {first.id}, replayed already" in out, (
        out
    )
    assert "2 replayed (2 records), 0 still failing, 0 replayed earlier, 1 the same" in out, out
    assert stored(upstream, topic) == [b"bad", b"bad"]  # `first` and `other`: two sends

    # the same batch refused once more, journaled after the replay: still written once
    late = new_entry(
        "rejected", topic, 0, policy="json", code=2, records=records, record_indexes=(0,)
    )
    with segment.open("ab") as out_file:
        out_file.write(encode_entry(late.to_metadata(), late.records))
    again = replay(config, topic)
    assert f"{late.id} {topic}-0: the same records as entry {first.id}" in again, again
    assert stored(upstream, topic) == [b"bad", b"bad"]
