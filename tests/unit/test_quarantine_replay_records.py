"""What `kvproxy quarantine replay` writes for an entry, and what it says when refused."""

from __future__ import annotations

from kvproxy.commands.replay import ReplayRecords, next_step, replay_records, without_stored
from kvproxy.journal import QuarantineEntry
from kvproxy.protocol.records import build_batch, read_batches
from tests.harness.quarantine import new_entry

ROWS = [(b"k", f"v{i}".encode(), [("h", b"x")], 1_700_000_000_000 + i) for i in range(4)]


def entry(records: bytes, **fields: object) -> QuarantineEntry:
    return new_entry("rejected", "t", 0, policy="json", code=87, records=records, **fields)


def values(chosen: ReplayRecords) -> list[bytes | None]:
    return [r.value for b in read_batches(chosen.records) for r in b.records()]


def test_only_the_refused_records_by_default_all_when_asked() -> None:
    idempotent = build_batch(ROWS, producer_id=9, producer_epoch=2, base_sequence=40)
    refused = entry(idempotent, record_indexes=(1, 3), produce_version=9)
    chosen = replay_records(refused)
    assert isinstance(chosen, ReplayRecords)
    assert (values(chosen), chosen.count, chosen.left_out) == ([b"v1", b"v3"], 2, 2)
    (batch,) = read_batches(chosen.records)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)
    assert [(tuple(r.headers), r.timestamp) for r in batch.records()] == [
        ((("h", b"x"),), ROWS[1][3]),
        ((("h", b"x"),), ROWS[3][3]),
    ]
    everything = replay_records(refused, all_records=True)
    assert isinstance(everything, ReplayRecords)
    assert (values(everything), everything.count, everything.left_out) == (
        [b"v0", b"v1", b"v2", b"v3"],
        4,
        0,
    )


def test_a_whole_batch_when_the_indexes_are_missing_cut_or_out_of_range() -> None:
    records = build_batch(ROWS)
    for fields in (
        {},
        {"record_indexes": (0,), "record_indexes_omitted": 3},
        {"record_indexes": (7,)},
    ):
        chosen = replay_records(entry(records, **fields))
        assert isinstance(chosen, ReplayRecords), fields
        assert (chosen.count, chosen.left_out) == (4, 0), fields


def test_a_transactional_batch_is_written_as_plain_records() -> None:
    records = build_batch(
        ROWS, producer_id=5, producer_epoch=0, base_sequence=0, is_transactional=True
    )
    chosen = replay_records(entry(records, record_indexes=(2,)))
    assert isinstance(chosen, ReplayRecords) and chosen.transactional
    (batch,) = read_batches(chosen.records)
    assert not batch.is_transactional and batch.producer_id == -1


def test_corrupt_or_undecodable_bytes_are_never_replayed() -> None:
    records = bytearray(build_batch(ROWS))
    records[-1] ^= 0xFF  # a record byte: the stored CRC no longer matches
    why = replay_records(entry(bytes(records)))
    assert isinstance(why, str) and "corrupt" in why and "never replayed" in why
    why = replay_records(entry(b"\x00" * 5))
    assert isinstance(why, str) and "do not decode" in why


def test_each_broker_refusal_names_what_to_do_next() -> None:
    assert next_step(10).startswith("raise max.message.bytes of the topic")
    assert next_step(3).startswith("create the topic")
    assert "replay again later" in next_step(6)
    assert next_step(45) == (
        "look up 45 OUT_OF_ORDER_SEQUENCE_NUMBER in the broker's log and replay again once fixed"
    )


def test_without_stored_leaves_out_each_stored_copy_once() -> None:
    """One stored copy stands for one replayed record: the same record refused twice and stored
    once is written once more. A LogAppendTime batch's timestamps are the broker's, so there
    key, value and headers decide; a CreateTime record with another timestamp is another one."""
    twice = [ROWS[0], ROWS[0], ROWS[1], ROWS[2]]
    refused = entry(build_batch(twice), record_indexes=(0, 1, 2, 3))
    chosen = replay_records(refused)
    assert isinstance(chosen, ReplayRecords)
    moved = (ROWS[2][0], ROWS[2][1], ROWS[2][2], ROWS[2][3] + 1)
    stored = build_batch([ROWS[0], moved]) + build_batch([ROWS[1]], timestamp_type=1)
    left = without_stored(refused, chosen, stored)
    assert isinstance(left, ReplayRecords)
    assert (values(left), left.count, left.indexes) == ([b"v0", b"v2"], 2, (1, 3))
    (batch,) = read_batches(left.records)
    assert batch.producer_id == -1
    assert without_stored(refused, chosen, b"") is chosen
