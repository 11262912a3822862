"""What one audit task does: run the proxy's policy chains over stored batches, emit violations.

Everything here runs on executors. The settings travel as plain data (`AuditSettings`, in
`kvproxy.pipeline.task_data`); each Python worker builds the topic routing from them once, with
the same `kvproxy.policies.config.build_routing` the proxy uses, so a backtest answers exactly what
the proxy would. A stored batch is checked as the one batch of a Produce request
(`ProducedRecords.stored` relaxes only what the broker itself changes on append: assigned offsets,
records removed by the cleaner); transaction markers (control batches) are the broker's own and are
counted, not checked. Quarantine entries are checked as the Produce request they were.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from kvproxy.pipeline import files
from kvproxy.pipeline.segments import (
    OFFSET_ORDER,
    CorruptRegion,
    JournalSegment,
    OffsetDisorder,
    SegmentRange,
)
from kvproxy.pipeline.task_data import AuditSettings, PartitionStats, Violation, routing_for
from kvproxy.policies.api import (
    UNKNOWN_TOPIC_CONFIG,
    ProducedRecords,
    RecordError,
    TopicConfig,
    Verdict,
    parse_records,
)
from kvproxy.policies.chain import Mode, PolicyChain
from kvproxy.policies.schemas.model import SchemaCatalog
from kvproxy.protocol import error_codes
from kvproxy.protocol.errors import DecodeError
from kvproxy.protocol.journal import iter_entries
from kvproxy.protocol.records import Record, RecordBatch, read_batch
from kvproxy.protocol.records.offsets import record_offset
from kvproxy.settings.errors import profile_code

__all__ = [
    "LATEST_PRODUCE_VERSION",
    "batch_frames",
    "bucket_size_ms",
    "check_unit",
    "key_preview",
    "stored_batch",
]

LATEST_PRODUCE_VERSION = 12
"""The request a stored magic 2 batch is checked as (the newest that names topics by name)."""
LEGACY_PRODUCE_VERSION = 2
"""The request a stored magic 0/1 message is checked as (v3+ carry only magic 2)."""
KEY_PREVIEW_BYTES = 32

_CLUSTER_COMPACTION: dict[tuple[tuple[str, ...], str], bool | None] = {}


def _cluster_compaction(bootstrap: tuple[str, ...], topic: str) -> bool | None:
    """Whether the cluster compacts `topic`, asked once per Python worker."""
    key = (bootstrap, topic)
    if key not in _CLUSTER_COMPACTION:
        from kvproxy.client.blocking import LiveSourceError, describe_compaction  # noqa: PLC0415

        try:
            _CLUSTER_COMPACTION[key] = describe_compaction(list(bootstrap), [topic]).get(topic)
        except LiveSourceError:
            _CLUSTER_COMPACTION[key] = None
    return _CLUSTER_COMPACTION[key]


def key_preview(key: bytes | None) -> str | None:
    """A short readable form of a key: text when it is UTF-8, else hex; None for a null key."""
    if key is None:
        return None
    head = key[:KEY_PREVIEW_BYTES]
    more = "…" if len(key) > KEY_PREVIEW_BYTES else ""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return f"0x{head.hex()}{more}"
    if text.isprintable():
        return text + more
    return f"0x{head.hex()}{more}"


class _Task:
    """One unit's scan: the routing, the stats per partition, the sample budget."""

    def __init__(self, settings: AuditSettings) -> None:
        self.settings = settings
        self.routing = routing_for(settings)
        self.profile = error_codes.ErrorProfile(settings.profile)
        self.stats: dict[tuple[str, int], PartitionStats] = {}
        self.budget = settings.sample_per_unit

    @property
    def exhausted(self) -> bool:
        return self.budget is not None and self.budget <= 0

    def stats_for(self, topic: str, partition: int) -> PartitionStats:
        key = (topic, partition)
        stats = self.stats.get(key)
        if stats is None:
            stats = PartitionStats(topic, partition, compacted=self.compacted(topic))
            self.stats[key] = stats
        return stats

    def compacted(self, topic: str) -> bool | None:
        override = self.routing.compacted_override(topic)
        if override is not None:
            return override
        if topic in self.settings.compaction or not self.settings.bootstrap:
            return self.settings.compaction.get(topic)
        return _cluster_compaction(self.settings.bootstrap, topic)

    def code_of(self, verdict: Verdict) -> int:
        return profile_code(self.profile, verdict)

    def violations(
        self,
        verdict: Verdict,
        produced: ProducedRecords | None,
        topic: str,
        partition: int,
        *,
        mode: Mode,
        source: str,
        position: int,
        in_log: bool,
        fallback: tuple[int, int | None],
    ) -> list[Violation]:
        """One row per record error, or one for a batch-level verdict."""
        code = self.code_of(verdict)
        name = error_codes.profile_error_name(self.profile, code)
        policy = verdict.policy or "unknown"
        rows: list[Violation] = []
        if verdict.record_errors and produced is not None:
            located = _locate(produced, verdict.record_errors)
            for error in verdict.record_errors:
                found = located.get(error.index)
                if found is None:
                    rows.append(
                        (topic, partition, -1, None, None, None, error.policy or policy, code, name,
                         error.message, mode.value, source, position)
                    )  # fmt: skip
                    continue
                _, record, offset = found
                rows.append(
                    (
                        topic,
                        partition,
                        offset if in_log else -1,
                        record.timestamp if record.timestamp >= 0 else None,
                        key_preview(record.key),
                        None if record.value is None else len(record.value),
                        error.policy or policy,  # merged errors name their own check
                        code,
                        name,
                        error.message,
                        mode.value,
                        source,
                        position,
                    )
                )
            return rows
        offset, timestamp = fallback
        message = verdict.message or name
        return [
            (topic, partition, offset if in_log else -1, timestamp, None, None, policy, code,
             name, message, mode.value, source, position)
        ]  # fmt: skip


def _locate(
    produced: ProducedRecords, errors: Sequence[RecordError]
) -> dict[int, tuple[RecordBatch, Record, int]]:
    """Record index -> (batch, record, offset as the log numbers it)."""
    wanted = {error.index for error in errors}
    out: dict[int, tuple[RecordBatch, Record, int]] = {}
    try:
        pairs = list(produced.batch_records())
    except DecodeError:
        return out
    last_inner: dict[int, int] = {}
    for batch, record in pairs:
        if batch.magic == 1:
            last_inner[id(batch)] = record.offset_delta
    for batch, record in pairs:
        if record.index in wanted:
            offset = record_offset(batch, record, last_inner.get(id(batch), 0))
            out[record.index] = (batch, record, offset)
    return out


def check_unit(
    unit: SegmentRange | CorruptRegion | OffsetDisorder | JournalSegment | Any,
    settings: AuditSettings,
) -> tuple[list[Violation], list[PartitionStats]]:
    """Scan one unit of work: its violations and what it scanned per partition."""
    task = _Task(settings)
    rows: list[Violation] = []
    if isinstance(unit, SegmentRange):
        data = files.read_range(unit.uri, unit.start, unit.end)
        rows.extend(_scan_log(task, unit.topic, unit.partition, batch_frames(data, unit.start),
                              source=unit.uri))  # fmt: skip
    elif isinstance(unit, CorruptRegion):
        rows.append(_corrupt_region(task, unit))
    elif isinstance(unit, OffsetDisorder):
        rows.append(_offset_disorder(task, unit))
    elif isinstance(unit, JournalSegment):
        rows.extend(_scan_journal(task, unit))
    else:
        from kvproxy.pipeline.live import fetch_batches  # noqa: PLC0415  (only live audits need it)

        window = (unit.low, unit.high)
        frames = ((-1, memoryview(raw)) for raw in fetch_batches(unit))
        source = f"kafka://{unit.leader}/{unit.topic}/{unit.partition}"
        rows.extend(_scan_log(task, unit.topic, unit.partition, frames, source=source,
                              window=window))  # fmt: skip
    return rows, list(task.stats.values())


def stored_batch(
    topic: str,
    partition: int,
    view: memoryview,
    batch: RecordBatch,
    *,
    compacted: bool | None = None,
    now_ms: int = 0,
    topic_config: TopicConfig = UNKNOWN_TOPIC_CONFIG,
    schemas: SchemaCatalog | None = None,
) -> ProducedRecords:
    """A stored batch (`view`, read as `batch`) as the one batch of the Produce request it was
    (`ProducedRecords.stored`): what the check pass and the schema id pass read."""
    return ProducedRecords(
        topic=topic,
        partition=partition,
        raw=view,
        batches=(batch,),
        produce_version=LATEST_PRODUCE_VERSION if batch.magic == 2 else LEGACY_PRODUCE_VERSION,
        acks=-1,
        transactional_id=None,
        compacted=compacted,
        now_ms=now_ms,
        stored=True,
        topic_config=topic_config,
        schemas=schemas,
    )


def batch_frames(data: bytes, base_position: int) -> Iterator[tuple[int, memoryview]]:
    """(byte position in the file, batch bytes) of every batch of a planned range."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        length = int.from_bytes(view[pos + 8 : pos + 12], "big", signed=True)
        end = pos + 12 + length
        yield base_position + pos, view[pos:end]
        pos = end


def _corrupt_region(task: _Task, unit: CorruptRegion) -> Violation:
    stats = task.stats_for(unit.topic, unit.partition)
    stats.bytes += unit.end - unit.start
    stats.violations += 1
    detail = f"{unit.reason}; {unit.end - unit.start} bytes up to byte {unit.end} skipped"
    rule = task.routing.rule_for(unit.topic)
    return _corrupt(
        unit.topic,
        unit.partition,
        unit.offset,
        rule.mode,
        rule.chain.parsed_by,
        source=unit.uri,
        position=unit.start,
        detail=detail,
    )


def _offset_disorder(task: _Task, unit: OffsetDisorder) -> Violation:
    """An `offset_order` row (CORRUPT_MESSAGE): the batch's bytes are counted and checked by
    the range that holds it."""
    task.stats_for(unit.topic, unit.partition).violations += 1
    code = error_codes.CORRUPT_MESSAGE
    message = (
        f"Offsets out of order in topic partition {unit.topic}-{unit.partition}: {unit.reason}"
    )
    mode = task.routing.rule_for(unit.topic).mode
    return (
        unit.topic, unit.partition, unit.offset, None, None, None, OFFSET_ORDER, code,
        error_codes.error_name(code), message, mode.value, unit.uri, unit.position,
    )  # fmt: skip


def _corrupt(
    topic: str,
    partition: int,
    offset: int | None,
    mode: Mode,
    parsed_by: str,
    *,
    source: str,
    position: int,
    detail: str,
) -> Violation:
    """A row for bytes that are not a batch (CORRUPT_MESSAGE, as the broker), in the name of the
    policy that judges parsing (`PolicyChain.parsed_by`)."""
    code = error_codes.CORRUPT_MESSAGE
    message = f"Record batch in topic partition {topic}-{partition} is corrupt: {detail}"
    return (
        topic, partition, offset, None, None, None, parsed_by, code,
        error_codes.error_name(code), message, mode.value, source, position,
    )  # fmt: skip


def _scan_log(
    task: _Task,
    topic: str,
    partition: int,
    frames: Iterable[tuple[int, memoryview]],
    *,
    source: str,
    window: tuple[int, int] | None = None,
) -> Iterator[Violation]:
    rule = task.routing.rule_for(topic)
    chain: PolicyChain = rule.chain
    compacted = task.compacted(topic)
    topic_config = task.routing.config_override(topic)  # the YAML's `config:`, as `serve` uses
    stats = task.stats_for(topic, partition)
    for position, view in frames:
        if task.exhausted:
            return
        stats.bytes += len(view)
        try:
            batch, _ = read_batch(view)
        except DecodeError as exc:
            stats.violations += 1
            offset = int.from_bytes(view[:8], "big", signed=True)  # framed, so 8 bytes are there
            yield _corrupt(
                topic,
                partition,
                offset,
                rule.mode,
                rule.chain.parsed_by,
                source=source,
                position=position,
                detail=str(exc),
            )
            continue
        if batch.is_control:
            stats.control_batches += 1
            continue
        stats.batches += 1
        stats.saw_time(batch.first_timestamp, batch.max_timestamp)
        produced = stored_batch(
            topic,
            partition,
            view,
            batch,
            compacted=compacted,
            now_ms=task.settings.now_ms,
            topic_config=topic_config,
            schemas=task.settings.schemas,
        )
        counted = _count_records(produced, batch, window, stats)
        if task.budget is not None:
            task.budget -= counted
        verdict = chain.check(produced)
        if verdict.ok:
            continue
        fallback_ts = batch.max_timestamp if batch.max_timestamp >= 0 else None
        rows = task.violations(
            verdict,
            produced,
            topic,
            partition,
            mode=rule.mode,
            source=source,
            position=position,
            in_log=True,
            fallback=(batch.base_offset, fallback_ts),
        )
        if window is not None:
            low, high = window
            rows = [row for row in rows if row[2] < 0 or low <= row[2] < high]
        stats.violations += len(rows)
        yield from rows


def _count_records(
    produced: ProducedRecords,
    batch: RecordBatch,
    window: tuple[int, int] | None,
    stats: PartitionStats,
) -> int:
    """Records of the batch inside the scan window, added to the stats."""
    try:
        if window is None or (window[0] <= batch.base_offset and batch.last_offset < window[1]):
            count = batch.record_count
        else:
            low, high = window
            count = sum(
                1
                for b, record in produced.batch_records()
                if low <= record_offset(b, record) < high
            )
    except DecodeError:
        count = 0  # the chain reports the corrupt records
    stats.records += count
    return count


def _scan_journal(task: _Task, unit: JournalSegment) -> Iterator[Violation]:
    """Every quarantined partition, checked as the Produce request it came in."""
    with files.open_binary(unit.uri) as handle:
        data = handle.read()
    try:
        for position, _, metadata, records in iter_entries(data):
            if task.exhausted:
                return
            if metadata.get("kind") not in ("rejected", "warned"):
                continue
            yield from _check_entry(task, unit.uri, position, metadata, records)
    except DecodeError:
        return  # a torn or corrupt tail ends the segment, as for every journal reader


def _check_entry(
    task: _Task, uri: str, position: int, metadata: Mapping[str, Any], records: bytes
) -> Iterator[Violation]:
    topic = str(metadata.get("topic", ""))
    partition = int(metadata.get("partition", -1))
    version = int(metadata.get("produce_version", -1))
    if version < 0:
        version = LATEST_PRODUCE_VERSION
    rule = task.routing.rule_for(topic)
    stats = task.stats_for(topic, partition)
    stats.bytes += len(records)
    parsed = parse_records(
        topic,
        partition,
        records,
        produce_version=version,
        acks=-1,
        transactional_id=None,
        compacted=task.compacted(topic),
        now_ms=task.settings.now_ms,
        topic_config=task.routing.config_override(topic),
        schemas=task.settings.schemas,
        parsed_by=rule.chain.parsed_by,
    )
    if isinstance(parsed, Verdict):  # the entry's records do not even parse
        verdict, produced = parsed, None
    else:
        produced = parsed
        stats.batches += len(parsed.batches)
        for batch in parsed.batches:
            stats.saw_time(batch.first_timestamp, batch.max_timestamp)
        try:
            count = len(parsed.record_tuple())
        except DecodeError:
            count = 0
        stats.records += count
        if task.budget is not None:
            task.budget -= count
        verdict = rule.chain.check(parsed)
        if verdict.ok:
            return
    rows = task.violations(
        verdict,
        produced,
        topic,
        partition,
        mode=rule.mode,
        source=uri,
        position=position,
        in_log=False,
        fallback=(-1, None),
    )
    stats.violations += len(rows)
    yield from rows


def bucket_size_ms(first_ms: int, last_ms: int, buckets: int = 60) -> int:
    """A round time bucket that cuts [first, last] into at most `buckets` pieces."""
    span = max(last_ms - first_ms, 1)
    for size in (
        1_000, 5_000, 10_000, 30_000, 60_000, 300_000, 900_000, 3_600_000, 6 * 3_600_000,
        86_400_000, 7 * 86_400_000, 30 * 86_400_000, 365 * 86_400_000,
    ):  # fmt: skip
        if span / size <= buckets:
            return size
    return math.ceil(span / buckets)
