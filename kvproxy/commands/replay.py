"""Replaying one quarantined entry: the records to write, the re-check, the cluster calls."""

from __future__ import annotations

import collections
import hashlib
import time
from dataclasses import dataclass
from typing import Any

from kvproxy.client.async_requests import partition_leader, produce_batch, read_partition_since
from kvproxy.client.core import UpstreamError
from kvproxy.journal import QuarantineEntry
from kvproxy.policies.api import TopicConfig, Verdict, parse_records
from kvproxy.policies.chain import Mode
from kvproxy.policies.config import TopicRouting
from kvproxy.protocol.error_codes import error_name
from kvproxy.protocol.errors import DecodeError, ProtocolError
from kvproxy.protocol.records import iter_batches, read_batches
from kvproxy.protocol.records.own_producer import as_own_producer

SKIP_STORED_BEFORE_MS = 60_000
"""--skip-stored reads from this long before the entry (the proxy's and the broker's clocks)."""
SKIP_STORED_MAX_BYTES = 64 * 1024 * 1024
"""--skip-stored reads at most this much of a partition for one entry."""
_REPLAY_PRODUCE_VERSION = 7


def same_records(entry: QuarantineEntry) -> bytes:
    """What makes two entries one for replay: the partition, the records bytes as sent and the
    records refused (a retried batch carries the same timestamps, producer fields and CRC)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{entry.topic}\0{entry.partition}\0".encode())
    digest.update(repr((entry.record_indexes, entry.record_indexes_omitted)).encode())
    digest.update(entry.records)
    return digest.digest()


@dataclass(frozen=True)
class ReplayRecords:
    """What replay produces for one entry: its records rewritten as kvproxy's own producer's."""

    records: bytes
    count: int
    left_out: int
    """Records of the entry not written: those the client was told were not refused."""
    transactional: bool
    """The entry's batches belonged to a transaction (which its producer aborted)."""
    indexes: tuple[int, ...] | None = None
    """The 0-based indexes of the records written, None for every one."""


_RECORD_ERRORS_SINCE = 8
"""Produce v8 (KIP-467) answers name the records refused (record_errors); older answers only
say the whole batch failed."""


def told_refused(entry: QuarantineEntry) -> tuple[int, ...] | None:
    """The records the client was told were refused, None for the whole batch.

    A client told which records failed (Produce v8+ with record_errors) sends the others again
    itself; a client told only that the batch failed (v7 and older, or an entry whose
    version is unknown) may have dropped every record of it, and replay owes it all of them."""
    if (
        entry.produce_version >= _RECORD_ERRORS_SINCE
        and entry.record_indexes
        and not entry.record_indexes_omitted
    ):
        return entry.record_indexes
    return None


def replay_records(
    entry: QuarantineEntry,
    *,
    all_records: bool = False,
    replayed: frozenset[int] | None = frozenset(),
) -> ReplayRecords | str:
    """The records to replay for `entry`, or why none can be.

    By default what the client was told failed (`told_refused`); every record with
    `all_records`; never those `replayed` already (None: every one was). The batches are
    written as a plain producer's: the original producer id, epoch and sequences belong to the
    client's session and a broker refuses them from anyone else or drops them as duplicates.
    Stored bytes whose CRC does not match are never replayed: rewriting them would give
    corrupt data a valid CRC."""
    try:
        batches = read_batches(entry.records)
    except DecodeError as exc:
        return f"the stored records do not decode ({exc}); see `kvproxy quarantine show`"
    if not batches:
        return "the entry holds no records"
    for batch in batches:
        if not (batch.crc_valid() and batch.inner_crcs_valid()):
            return (
                f"the stored batch is corrupt (CRC {batch.crc:#010x}, computed "
                f"{batch.computed_crc():#010x}), as the client sent it; it is never replayed"
            )
    total = sum(max(batch.record_count, 0) for batch in batches)
    refused = None if all_records else told_refused(entry)
    wanted = set(range(total)) if refused is None else {i for i in refused if 0 <= i < total}
    wanted = wanted or set(range(total))
    keep = set() if replayed is None else wanted - replayed
    try:
        records = as_own_producer(entry.records, None if len(keep) == total else keep)
    except DecodeError as exc:
        return f"the stored records do not decode ({exc}); see `kvproxy quarantine show`"
    return ReplayRecords(
        records=records if keep else b"",  # nothing left: the caller writes nothing
        count=len(keep),
        left_out=total - len(wanted),
        transactional=any(batch.is_transactional for batch in batches),
        indexes=None if len(keep) == total else tuple(sorted(keep)),
    )


def _identity(record: Any, timestamp: bool) -> tuple[Any, ...]:
    return (
        record.key,
        record.value,
        tuple(record.headers),
        record.timestamp if timestamp else None,
    )


def without_stored(
    entry: QuarantineEntry, chosen: ReplayRecords, stored: bytes
) -> ReplayRecords | str:
    """`chosen` less the records `stored` already holds: the same key, value, headers and
    timestamp (a LogAppendTime batch's timestamps are the broker's, so there only the rest),
    each stored record standing for one replayed record."""
    found: collections.Counter[tuple[Any, ...]] = collections.Counter()
    for batch in iter_batches(stored, allow_partial_tail=True):
        if batch.is_control:
            continue
        create_time = batch.timestamp_type == 0
        for record in batch.records():
            found[_identity(record, create_time)] += 1
    wanted = None if chosen.indexes is None else set(chosen.indexes)
    keep: list[int] = []
    index = 0
    for batch in read_batches(entry.records):
        for record in batch.records():
            if wanted is None or index in wanted:
                for key in (_identity(record, True), _identity(record, False)):
                    if found[key] > 0:
                        found[key] -= 1
                        break
                else:
                    keep.append(index)
            index += 1
    if len(keep) == chosen.count:
        return chosen
    records = as_own_producer(entry.records, set(keep)) if keep else b""
    return ReplayRecords(
        records=records,
        count=len(keep),
        left_out=chosen.left_out,
        transactional=chosen.transactional,
        indexes=tuple(keep),
    )


def _since_ms(entry: QuarantineEntry) -> int:
    """Shortly before the entry's time or its earliest record's, whichever is first: a copy
    has the record's own timestamp (CreateTime) or a broker time near the entry's."""
    times = [
        record.timestamp
        for batch in read_batches(entry.records)
        for record in batch.records()
        if record.timestamp >= 0
    ]
    return max(0, min([entry.time_ms - SKIP_STORED_BEFORE_MS, *times]))


async def skip_stored(
    leader: tuple[str, int],
    ssl_context: Any,
    timeout: float,
    entry: QuarantineEntry,
    chosen: ReplayRecords,
) -> ReplayRecords | str:
    """`chosen` less what the partition holds already, or why that could not be read."""
    try:
        first, stored, complete = await read_partition_since(
            leader,
            ssl_context,
            timeout,
            topic=entry.topic,
            partition=entry.partition,
            since_ms=_since_ms(entry),
            max_bytes=SKIP_STORED_MAX_BYTES,
        )
    except UpstreamError as exc:
        return f"--skip-stored could not read the partition back ({exc}): {next_step(exc.code)}"
    except (OSError, TimeoutError, ProtocolError) as exc:
        return f"--skip-stored could not read the partition back: {exc}"
    if not complete:
        return (
            f"--skip-stored read {SKIP_STORED_MAX_BYTES // 2**20} MiB from offset {first} "
            "without reaching the partition's end; replay without --skip-stored to write it"
        )
    return without_stored(entry, chosen, stored)


def recheck(
    routing: TopicRouting, entry: QuarantineEntry, records: bytes, settings: TopicConfig
) -> Verdict:
    chain = routing.chain_for(entry.topic)
    parsed = parse_records(
        entry.topic,
        entry.partition,
        records,
        produce_version=_REPLAY_PRODUCE_VERSION,
        acks=-1,
        transactional_id=None,
        compacted=settings.compacted,
        now_ms=int(time.time() * 1000),
        topic_config=settings,
        parsed_by=chain.parsed_by,
    )
    if isinstance(parsed, Verdict):
        return parsed
    if chain.mode is Mode.OFF:
        return Verdict()
    return chain.check(parsed)


_NEXT_STEPS = {
    3: "create the topic (or the partition), then replay again",
    10: "raise max.message.bytes of the topic (or the broker's message.max.bytes), then replay "
    "again",
    18: "raise max.message.bytes of the topic (or the broker's message.max.bytes), then replay "
    "again",
    29: "allow the replay's user (upstream sasl:) to write to the topic, then replay again",
    32: "widen the topic's message.timestamp.before.max.ms / after.max.ms (or set "
    "message.timestamp.type=LogAppendTime), then replay again",
    87: "the broker's own checks refuse the records (a compacted topic needs keys, for one); "
    "see `kvproxy quarantine show`",
}
_RETRIABLE = {6, 7, 8, 13, 14, 15, 19, 20, 56}


def next_step(code: int) -> str:
    """What an operator does about the broker answering `code` to a replayed entry."""
    if code in _NEXT_STEPS:
        return _NEXT_STEPS[code]
    if code in _RETRIABLE:
        return "the cluster is not ready (a retriable error): replay again later"
    return f"look up {code} {error_name(code)} in the broker's log and replay again once fixed"


async def entry_leader(
    bootstrap: list[tuple[str, int]], ssl_context: Any, timeout: float, entry: QuarantineEntry
) -> tuple[tuple[str, int], str | None]:
    """The leader of the entry's partition, or why there is none (with what to do)."""
    try:
        leader = await partition_leader(
            bootstrap, ssl_context, timeout, entry.topic, entry.partition
        )
    except (OSError, TimeoutError, ProtocolError) as exc:
        return ("", 0), f"the cluster: {exc} (check that it is reachable)"
    if leader is None:
        return ("", 0), (
            f"no leader for {entry.topic}-{entry.partition} (create the topic or the "
            "partition, or wait for a leader, then replay again)"
        )
    return leader, None


async def produce_entry(
    leader: tuple[str, int],
    ssl_context: Any,
    timeout: float,
    entry: QuarantineEntry,
    records: bytes,
) -> str | None:
    """The error if the records were not written (with what to do about it)."""
    address = f"{leader[0]}:{leader[1]}"
    try:
        code = await produce_batch(
            leader,
            ssl_context,
            timeout,
            topic=entry.topic,
            partition=entry.partition,
            records=records,
        )
    except (OSError, TimeoutError, ProtocolError) as exc:
        return (
            f"{address}: {exc} (check that the cluster is reachable; a timeout may have "
            "written the records anyway)"
        )
    if code != 0:
        return f"the broker at {address} answered {code} {error_name(code)}: {next_step(code)}"
    return None
