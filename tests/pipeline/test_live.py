"""The live-topic reader against a real broker (Tansu): planning, chunked fetching, time specs,
errors, and compaction discovery; plus the offset-spec parser on its own.

Records are produced with confluent-kafka in groups, one flush per group, so each group is one
batch: partition 0 holds batches [0-2] [3] [4-8] [9-10] [11-14], record n stamped T0 + n s;
partition 1 holds [0-1] [2-3], record n stamped T0 + 3n s.
"""

from __future__ import annotations

import datetime
import itertools
import math
import pickle
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, replace

import pytest

from kvproxy.client import blocking
from kvproxy.client.blocking import describe_compaction
from kvproxy.pipeline import live
from kvproxy.pipeline.live import (
    LiveRange,
    LiveSourceError,
    Timestamp,
    fetch_batches,
    parse_offset_spec,
    plan_live_ranges,
)
from kvproxy.protocol.records import RecordBatch, read_batch
from tests.harness import Broker, free_port

T0 = 1_700_000_000_000  # ms; fixed so the time specs below are exact
P0_GROUPS = (3, 1, 5, 2, 4)
P0_BASES = (0, 3, 4, 9, 11)
P1_GROUPS = (2, 2)


def _produce(
    bootstrap: str, topic: str, partition: int, groups: tuple[int, ...], step: int
) -> None:
    """One batch per group; record n gets value p<partition>-<n> and time T0 + n * step."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1000})
    errors: list[object] = []
    n = 0
    for size in groups:
        for _ in range(size):
            producer.produce(
                topic,
                value=f"p{partition}-{n}".encode(),
                key=f"k{n}".encode(),
                partition=partition,
                timestamp=T0 + n * step,
                on_delivery=lambda e, m: errors.append(e),
            )
            n += 1
        assert producer.flush(20) == 0
    assert errors == [None] * n


@dataclass(frozen=True)
class Produced:
    bootstrap: str
    topic: str


@pytest.fixture
def produced(tansu: Broker, make_topic: Callable[..., str]) -> Produced:
    topic = make_topic(partitions=2)
    _produce(tansu.bootstrap, topic, 0, P0_GROUPS, 1000)
    _produce(tansu.bootstrap, topic, 1, P1_GROUPS, 3000)
    return Produced(tansu.bootstrap, topic)


def _batches(ranges: list[LiveRange], **kwargs: int) -> Iterator[tuple[LiveRange, RecordBatch]]:
    for r in ranges:
        for raw in fetch_batches(r, **kwargs):
            batch, end = read_batch(raw)
            assert end == len(raw)  # exactly one whole batch, prefix included
            yield r, batch


def _keys(batches: list[tuple[LiveRange, RecordBatch]]) -> list[tuple[int, int]]:
    return [(r.partition, b.base_offset) for r, b in batches]


def _values(batches: list[tuple[LiveRange, RecordBatch]]) -> set[tuple[int, bytes | None]]:
    """(partition, value) of every record inside its partition's scan window."""
    return {
        (r.partition, record.value)
        for r, b in batches
        for record in b.records()
        if r.low <= b.base_offset + record.offset_delta < r.high
    }


def _expected(p0: range, p1: range) -> set[tuple[int, bytes | None]]:
    return {(0, f"p0-{n}".encode()) for n in p0} | {(1, f"p1-{n}".encode()) for n in p1}


# -- parse_offset_spec (no broker) -------------------------------------------------------------


def _ms(year: int, month: int, day: int, hour: int = 0) -> int:
    return int(datetime.datetime(year, month, day, hour, tzinfo=datetime.UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("123", 123),
        ("0", 0),
        (" 42 ", 42),
        (None, None),
        ("earliest", None),
        ("LATEST", None),
        ("2026-11-01", Timestamp(_ms(2026, 11, 1))),
        ("2026-11-01T10:00:00Z", Timestamp(_ms(2026, 11, 1, 10))),
        ("2026-11-01T10:00:00", Timestamp(_ms(2026, 11, 1, 10))),  # naive = UTC
        ("2026-11-01 10:00", Timestamp(_ms(2026, 11, 1, 10))),
        ("2026-11-01T12:00:00+02:00", Timestamp(_ms(2026, 11, 1, 10))),
        ("2026-11-01T10:00:00.250Z", Timestamp(_ms(2026, 11, 1, 10) + 250)),
        ("1970-01-01", Timestamp(0)),
    ],
)
def test_parse_offset_spec(text: str | None, spec: live.OffsetSpec) -> None:
    assert parse_offset_spec(text) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-5", "cannot be negative"),
        ("", "cannot read offset spec"),
        ("yesterday", "cannot read offset spec '"),
        ("12abc", "ISO 8601"),
        ("2026-13-01", "cannot read"),
        ("1969-12-31", "before 1970"),
    ],
)
def test_parse_offset_spec_refuses_with_a_clear_message(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_offset_spec(text)


def test_timestamp_refuses_negative_times() -> None:
    """Negative ListOffsets timestamps are requests (-1 latest, -2 earliest), never times."""
    with pytest.raises(ValueError, match="before 1970"):
        Timestamp(-1)


def test_ranges_and_specs_pickle() -> None:
    """Spark ships them to executors."""
    r = LiveRange(("a:1", "b:2"), "t", 3, "a:1", 10, 20, 5, 30)
    assert pickle.loads(pickle.dumps(r)) == r
    assert pickle.loads(pickle.dumps(Timestamp(5))) == Timestamp(5)


def test_bad_arguments_are_value_errors() -> None:
    with pytest.raises(ValueError, match="offsets_per_range"):
        plan_live_ranges(["127.0.0.1:1"], "t", offsets_per_range=0)
    with pytest.raises(ValueError, match="start offset -1"):
        plan_live_ranges(["127.0.0.1:1"], "t", start=-1)
    with pytest.raises(LiveSourceError, match="not host:port"):
        plan_live_ranges(["nohost"], "t")
    with pytest.raises(LiveSourceError, match="no bootstrap"):
        plan_live_ranges([], "t")


# -- planning ----------------------------------------------------------------------------------


def test_plan_covers_each_partition_window(produced: Produced) -> None:
    ranges = plan_live_ranges([produced.bootstrap], produced.topic)
    base = LiveRange((produced.bootstrap,), produced.topic, 0, produced.bootstrap, 0, 15, 0, 15)
    assert ranges == [base, replace(base, partition=1, end=4, high=4)]


def test_bootstrap_may_be_one_comma_separated_string(produced: Produced) -> None:
    dead = f"127.0.0.1:{free_port()}"
    ranges = plan_live_ranges(f"{dead}, {produced.bootstrap}", produced.topic)
    assert [r.bootstrap for r in ranges] == [(dead, produced.bootstrap)] * 2


def test_fetch_yields_every_batch_as_stored(produced: Produced) -> None:
    batches = list(_batches(plan_live_ranges([produced.bootstrap], produced.topic)))
    assert _keys(batches) == [(0, o) for o in P0_BASES] + [(1, 0), (1, 2)]
    assert all(b.crc_valid() for _, b in batches)
    assert [b.record_count for r, b in batches if r.partition == 0] == list(P0_GROUPS)
    assert _values(batches) == _expected(range(15), range(4))
    times = [rec.timestamp for r, b in batches if r.partition == 0 for rec in b.records()]
    assert times == [T0 + n * 1000 for n in range(15)]


@pytest.mark.parametrize("per", [1, 2, 3, 4, 5, 7, 15, 1000])
def test_chunks_read_every_batch_exactly_once(produced: Produced, per: int) -> None:
    ranges = plan_live_ranges([produced.bootstrap], produced.topic, offsets_per_range=per)
    assert len(ranges) == math.ceil(15 / per) + math.ceil(4 / per)
    for p, high in ((0, 15), (1, 4)):
        chunks = [(r.start, r.end) for r in ranges if r.partition == p]
        assert chunks[0][0] == 0 and chunks[-1][1] == high
        assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
    batches = list(_batches(ranges))
    assert sorted(_keys(batches)) == [(0, o) for o in P0_BASES] + [(1, 0), (1, 2)]
    assert _values(batches) == _expected(range(15), range(4))


def test_window_by_offsets(produced: Produced) -> None:
    ranges = plan_live_ranges([produced.bootstrap], produced.topic, start=4, end=10)
    assert [(r.partition, r.low, r.high) for r in ranges] == [(0, 4, 10)]  # p1 ends at 4
    batches = list(_batches(ranges))
    assert [b.base_offset for _, b in batches] == [4, 9]
    assert _values(batches) == _expected(range(4, 10), range(0))


def test_window_starting_inside_a_batch_chunked(produced: Produced) -> None:
    """Start 2 is inside batch [0-2]: that batch belongs to the first chunk, and to no other."""
    for per in (1, 2, 3, 100):
        ranges = plan_live_ranges(
            [produced.bootstrap], produced.topic, start=2, end=1000, offsets_per_range=per
        )
        assert {(r.partition, r.low, r.high) for r in ranges} == {(0, 2, 15), (1, 2, 4)}
        batches = list(_batches(ranges))
        assert _keys(batches) == [(0, o) for o in P0_BASES] + [(1, 2)]
        assert _values(batches) == _expected(range(2, 15), range(2, 4))


def test_window_by_time(produced: Produced) -> None:
    """A time is the first offset stamped at or after it (Tansu's ListOffsets answers 0 for any
    time, so this also pins the reader's check of that answer)."""
    ranges = plan_live_ranges(
        [produced.bootstrap], produced.topic, start=Timestamp(T0 + 4500), end=Timestamp(T0 + 9000)
    )
    # p0: offsets 5..8 (times T0+5s..T0+8s); p1 (T0, +3s, +6s, +9s): offset 2 only.
    assert [(r.partition, r.low, r.high) for r in ranges] == [(0, 5, 9), (1, 2, 3)]
    batches = list(_batches(ranges))
    assert _keys(batches) == [(0, 4), (1, 2)]
    assert _values(batches) == _expected(range(5, 9), range(2, 3))


@pytest.mark.parametrize(
    ("start", "end", "windows"),
    [
        (Timestamp(T0 - 1), None, [(0, 0, 15), (1, 0, 4)]),
        (Timestamp(T0), Timestamp(T0 + 1), [(0, 0, 1), (1, 0, 1)]),
        (Timestamp(T0 + 14_000), None, [(0, 14, 15)]),
        (Timestamp(T0 + 99_000), None, []),
        (None, Timestamp(T0 + 6000), [(0, 0, 6), (1, 0, 2)]),
        (3, Timestamp(T0 + 6000), [(0, 3, 6)]),
    ],
)
def test_time_edges(
    produced: Produced,
    start: live.OffsetSpec,
    end: live.OffsetSpec,
    windows: list[tuple[int, int, int]],
) -> None:
    ranges = plan_live_ranges([produced.bootstrap], produced.topic, start=start, end=end)
    assert [(r.partition, r.low, r.high) for r in ranges] == windows


def test_empty_partition_gives_no_range(tansu: Broker, make_topic: Callable[..., str]) -> None:
    topic = make_topic(partitions=2)
    assert plan_live_ranges([tansu.bootstrap], topic) == []
    _produce(tansu.bootstrap, topic, 1, (2,), 1)
    assert [(r.partition, r.low, r.high) for r in plan_live_ranges([tansu.bootstrap], topic)] == [
        (1, 0, 2)
    ]


def test_unknown_topic_is_named_and_not_created(tansu: Broker) -> None:
    for _ in range(2):  # asking must not create it (Metadata with auto-creation off)
        with pytest.raises(LiveSourceError, match="unknown topic 'no-such-topic-x1'"):
            plan_live_ranges([tansu.bootstrap], "no-such-topic-x1")


def test_unreachable_bootstrap_fails_fast(produced: Produced) -> None:
    dead = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(LiveSourceError, match=f"cannot connect to {dead}"):
        plan_live_ranges([dead], produced.topic, timeout_s=5)
    with pytest.raises(LiveSourceError, match="cannot reach any bootstrap server"):
        describe_compaction([dead], [produced.topic], timeout_s=5)
    r = LiveRange((dead,), produced.topic, 0, dead, 0, 15, 0, 15)
    with pytest.raises(LiveSourceError, match=dead):
        list(fetch_batches(r, timeout_s=5))
    assert time.monotonic() - started < 5


# -- fetching ----------------------------------------------------------------------------------


def test_a_leader_that_went_away_is_looked_up_again(produced: Produced) -> None:
    (whole, _) = plan_live_ranges([produced.bootstrap], produced.topic)
    moved = replace(whole, leader=f"127.0.0.1:{free_port()}")
    assert [b.base_offset for _, b in _batches([moved])] == list(P0_BASES)


def _failing_fetch(monkeypatch: pytest.MonkeyPatch, codes: list[int]) -> None:
    """The next Fetches answer the partition error codes in `codes`; later ones are real.

    Tansu answers every partition fault (offset out of range, no such partition) with an empty
    partition and no error, so the codes are injected.
    """
    real = blocking.fetch

    def fetch(
        broker: blocking.Broker, topic: str, offsets: Mapping[int, int], **kw: int
    ) -> dict[int, blocking.FetchAnswer | int]:
        if codes:
            return dict.fromkeys(offsets, codes.pop(0))
        return real(broker, topic, offsets, **kw)

    monkeypatch.setattr(blocking, "fetch", fetch)


def test_partition_error_is_named(produced: Produced, monkeypatch: pytest.MonkeyPatch) -> None:
    (whole, _) = plan_live_ranges([produced.bootstrap], produced.topic)
    _failing_fetch(monkeypatch, [1])
    with pytest.raises(LiveSourceError, match=r"at offset 0 failed: OFFSET_OUT_OF_RANGE"):
        list(fetch_batches(whole))


def test_not_leader_looks_the_leader_up_again(
    produced: Produced, monkeypatch: pytest.MonkeyPatch
) -> None:
    (whole, _) = plan_live_ranges([produced.bootstrap], produced.topic)
    _failing_fetch(monkeypatch, [6])  # NOT_LEADER_OR_FOLLOWER once
    assert [b.base_offset for _, b in _batches([whole])] == list(P0_BASES)
    _failing_fetch(monkeypatch, [6, 6, 6])
    with pytest.raises(LiveSourceError, match=r"NOT_LEADER_OR_FOLLOWER \(after 3 attempts\)"):
        list(fetch_batches(whole))


def test_chunk_past_the_high_watermark_ends(produced: Produced) -> None:
    r = LiveRange((produced.bootstrap,), produced.topic, 0, produced.bootstrap, 15, 40, 0, 40)
    assert list(fetch_batches(r)) == []


def _truncating_fetch(monkeypatch: pytest.MonkeyPatch, *, kip74: bool) -> list[int]:
    """Make every Fetch answer end where a broker's byte limit would cut it: at max_bytes, mid
    batch; with KIP-74 never before the end of the first batch. Returns the limits asked for."""
    real = blocking.fetch
    asked: list[int] = []

    def fetch(
        broker: blocking.Broker,
        topic: str,
        offsets: Mapping[int, int],
        *,
        max_bytes: int,
        **kw: int,
    ) -> dict[int, blocking.FetchAnswer | int]:
        answers = real(broker, topic, offsets, max_bytes=max_bytes, **kw)
        asked.append(max_bytes)
        cut: dict[int, blocking.FetchAnswer | int] = {}
        for p, a in answers.items():
            cut[p] = a
            if isinstance(a, blocking.FetchAnswer):
                keep = max_bytes
                if kip74 and len(a.records) >= 12:
                    keep = max(keep, read_batch(a.records)[0].size)
                cut[p] = blocking.FetchAnswer(a.records[:keep], a.high_watermark, a.log_start)
        return cut

    monkeypatch.setattr(blocking, "fetch", fetch)
    return asked


@pytest.mark.parametrize("max_bytes", [1, 50, 100, 150, 300])
def test_partial_batches_are_fetched_again(
    produced: Produced, monkeypatch: pytest.MonkeyPatch, max_bytes: int
) -> None:
    ranges = plan_live_ranges([produced.bootstrap], produced.topic, offsets_per_range=4)
    _truncating_fetch(monkeypatch, kip74=True)
    batches = list(_batches(ranges, max_bytes=max_bytes))
    assert sorted(_keys(batches)) == [(0, o) for o in P0_BASES] + [(1, 0), (1, 2)]
    assert _values(batches) == _expected(range(15), range(4))


def test_oversized_batch_without_kip74_asks_for_its_size(
    produced: Produced, monkeypatch: pytest.MonkeyPatch
) -> None:
    (whole, _) = plan_live_ranges([produced.bootstrap], produced.topic)
    asked = _truncating_fetch(monkeypatch, kip74=False)
    assert [b.base_offset for _, b in _batches([whole], max_bytes=20)] == list(P0_BASES)
    assert max(asked) > 20


def test_no_progress_raises_instead_of_looping(
    produced: Produced, monkeypatch: pytest.MonkeyPatch
) -> None:
    (whole, _) = plan_live_ranges([produced.bootstrap], produced.topic)
    real = blocking.fetch

    def empty(
        broker: blocking.Broker, topic: str, offsets: Mapping[int, int], **kw: int
    ) -> dict[int, blocking.FetchAnswer | int]:
        answers = real(broker, topic, offsets, **kw)
        return {
            p: blocking.FetchAnswer(b"", a.high_watermark, a.log_start)
            for p, a in answers.items()
            if isinstance(a, blocking.FetchAnswer)
        }

    monkeypatch.setattr(blocking, "fetch", empty)
    with pytest.raises(LiveSourceError, match="no progress"):
        list(fetch_batches(whole))


def test_stopping_early_closes_the_connection(produced: Produced) -> None:
    (whole, _) = plan_live_ranges([produced.bootstrap], produced.topic)
    batches = fetch_batches(whole)
    assert isinstance(batches, Generator)
    first = next(batches)
    assert read_batch(first)[0].base_offset == 0
    batches.close()


# -- every version the reader may pick -------------------------------------------------------


@pytest.mark.parametrize("version", range(4, 13))
def test_every_fetch_version(
    produced: Produced, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    ranges = plan_live_ranges([produced.bootstrap], produced.topic, offsets_per_range=5)
    monkeypatch.setattr(blocking, "_FETCH_VERSIONS", (version, version))
    assert _values(list(_batches(ranges))) == _expected(range(15), range(4))


@pytest.mark.parametrize(("metadata", "list_offsets"), [(v, min(v - 3, 9)) for v in range(4, 13)])
def test_every_metadata_and_list_offsets_version(
    produced: Produced, monkeypatch: pytest.MonkeyPatch, metadata: int, list_offsets: int
) -> None:
    monkeypatch.setattr(blocking, "_METADATA_VERSIONS", (metadata, metadata))
    monkeypatch.setattr(blocking, "_LIST_OFFSETS_VERSIONS", (list_offsets, list_offsets))
    ranges = plan_live_ranges([produced.bootstrap], produced.topic, start=Timestamp(T0 + 4500))
    assert [(r.partition, r.low, r.high) for r in ranges] == [(0, 5, 15), (1, 2, 4)]


def test_versions_outside_what_the_broker_serves_are_refused(
    produced: Produced, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blocking, "_LIST_OFFSETS_VERSIONS", (10, 11))  # Tansu serves 0-9
    with pytest.raises(LiveSourceError, match=r"serves ListOffsets v0-v9"):
        plan_live_ranges([produced.bootstrap], produced.topic)


# -- compaction ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(1, 5))
def test_describe_compaction(
    tansu: Broker, make_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    monkeypatch.setattr(blocking, "_DESCRIBE_CONFIGS_VERSIONS", (version, version))
    compacted = make_topic(config={"cleanup.policy": "compact"})
    both = make_topic(config={"cleanup.policy": "compact,delete"})
    plain = make_topic()
    assert describe_compaction([tansu.bootstrap], [compacted, plain, both, compacted]) == {
        compacted: True,
        plain: False,
        both: True,
    }
    assert describe_compaction([tansu.bootstrap], []) == {}
