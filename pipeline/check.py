"""What one audit task does: run the proxy's policy chains over stored batches, emit violations.

Everything here runs on executors. The settings travel as plain data (`AuditSettings`); each
Python worker builds the topic routing from them once, with the same `policies.build_routing`
the proxy uses, so a backtest answers exactly what the proxy would. A stored batch is checked as
the one batch of a Produce request (`ProducedRecords.stored` relaxes only what the broker itself
changes on append: assigned offsets, records removed by the cleaner); transaction markers
(control batches) are the broker's own and are counted, not checked. Quarantine entries are
checked as the Produce request they were.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline import files
from pipeline.segments import CorruptRegion, JournalSegment, SegmentRange
from policies.api import ProducedRecords, RecordError, Verdict, parse_records
from policies.builtin.broker import record_offset
from policies.chain import Mode, PolicyChain
from policies.config import TopicRouting, build_routing
from protocol import error_codes
from protocol.errors import DecodeError
from protocol.journal import iter_entries
from protocol.records import Record, RecordBatch, read_batch

__all__ = [
    "VIOLATION_FIELDS",
    "AuditSettings",
    "PartitionStats",
    "check_unit",
    "key_preview",
]

LATEST_PRODUCE_VERSION = 12
"""The request a stored magic 2 batch is checked as (the newest that names topics by name)."""
LEGACY_PRODUCE_VERSION = 2
"""The request a stored magic 0/1 message is checked as (v3+ carry only magic 2)."""
KEY_PREVIEW_BYTES = 32

VIOLATION_FIELDS: tuple[tuple[str, str], ...] = (
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "long"),
    ("timestamp", "long"),
    ("key_preview", "string"),
    ("value_size", "int"),
    ("policy", "string"),
    ("error_code", "int"),
    ("error_name", "string"),
    ("message", "string"),
    ("mode", "string"),
    ("source", "string"),
    ("position", "long"),
)
"""Columns of `violations/`, in order (Spark SQL type names). `offset` is -1 where the record is
not in a log (quarantine entries); `position` is the byte in `source` where its batch starts."""

Violation = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class AuditSettings:
    """Everything a task needs besides its unit of work; plain data, pickled to executors."""

    defaults: Mapping[str, Any] | None
    topics: Sequence[Mapping[str, Any]] | None
    base_dir: str
    profile: str = "kafka"
    compaction: Mapping[str, bool | None] = field(default_factory=dict)
    """topic -> compacted, as the cluster says (used where the YAML does not say)."""
    now_ms: int = 0
    """The time the `timestamps` policy compares against."""
    sample_per_unit: int | None = None
    """Stop a unit after this many records (`--sample`)."""
    bootstrap: tuple[str, ...] = ()
    """The cluster to ask about topics `compaction` does not know yet (quarantined ones)."""
    policies: Mapping[str, str] | None = None
    """Policy name -> `module:attr`, from the driver's installed entry points
    (`plugins.entry_point_targets`): executors given the code as a zip have no such metadata.
    None: scan the installed entry points."""

    def key(self) -> str:
        return json.dumps([self.defaults, self.topics, self.base_dir], sort_keys=True, default=str)


_ROUTINGS: dict[str, TopicRouting] = {}


def routing_for(settings: AuditSettings) -> TopicRouting:
    """The routing of these settings, built once per Python worker."""
    key = settings.key()
    routing = _ROUTINGS.get(key)
    if routing is None:
        routing = build_routing(
            settings.defaults,
            settings.topics,
            Path(settings.base_dir),
            policy_targets=settings.policies,
        )
        _ROUTINGS[key] = routing
    return routing


@dataclass(slots=True)
class PartitionStats:
    """What a unit scanned in one topic-partition; merged across units by the driver."""

    topic: str
    partition: int
    records: int = 0
    batches: int = 0
    bytes: int = 0
    control_batches: int = 0
    violations: int = 0
    first_ms: int | None = None
    last_ms: int | None = None
    compacted: bool | None = None
    """As the checks saw it (YAML, else the cluster); None when unknown."""

    def saw_time(self, low: int, high: int) -> None:
        if low >= 0:
            self.first_ms = low if self.first_ms is None else min(self.first_ms, low)
        if high >= 0:
            self.last_ms = high if self.last_ms is None else max(self.last_ms, high)

    def merge(self, other: PartitionStats) -> None:
        self.records += other.records
        self.batches += other.batches
        self.bytes += other.bytes
        self.control_batches += other.control_batches
        self.violations += other.violations
        if self.compacted is None:
            self.compacted = other.compacted
        for value in (other.first_ms, other.last_ms):
            if value is not None:
                self.saw_time(value, value)


_CLUSTER_COMPACTION: dict[tuple[tuple[str, ...], str], bool | None] = {}


def _cluster_compaction(bootstrap: tuple[str, ...], topic: str) -> bool | None:
    """Whether the cluster compacts `topic`, asked once per Python worker."""
    key = (bootstrap, topic)
    if key not in _CLUSTER_COMPACTION:
        from pipeline.live import LiveSourceError, describe_compaction  # noqa: PLC0415

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
        if self.profile is error_codes.ErrorProfile.KIP and verdict.rejection is not None:
            return error_codes.rejection_code(
                self.profile, error_codes.Rejection(verdict.rejection)
            )
        return verdict.code

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
    unit: SegmentRange | CorruptRegion | JournalSegment | Any, settings: AuditSettings
) -> tuple[list[Violation], list[PartitionStats]]:
    """Scan one unit of work: its violations and what it scanned per partition."""
    task = _Task(settings)
    rows: list[Violation] = []
    if isinstance(unit, SegmentRange):
        data = files.read_range(unit.uri, unit.start, unit.end)
        rows.extend(_scan_log(task, unit.topic, unit.partition, _frames(data, unit.start),
                              source=unit.uri))  # fmt: skip
    elif isinstance(unit, CorruptRegion):
        rows.append(_corrupt_region(task, unit))
    elif isinstance(unit, JournalSegment):
        rows.extend(_scan_journal(task, unit))
    else:
        from pipeline.live import fetch_batches  # noqa: PLC0415  (only live audits need it)

        window = (unit.low, unit.high)
        frames = ((-1, memoryview(raw)) for raw in fetch_batches(unit))
        source = f"kafka://{unit.leader}/{unit.topic}/{unit.partition}"
        rows.extend(_scan_log(task, unit.topic, unit.partition, frames, source=source,
                              window=window))  # fmt: skip
    return rows, list(task.stats.values())


def _frames(data: bytes, base_position: int) -> Iterator[tuple[int, memoryview]]:
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
    mode = task.routing.rule_for(unit.topic).mode
    return _corrupt(
        unit.topic,
        unit.partition,
        unit.base_offset,
        mode,
        source=unit.uri,
        position=unit.start,
        detail=detail,
    )


def _corrupt(
    topic: str, partition: int, offset: int, mode: Mode, *, source: str, position: int, detail: str
) -> Violation:
    """A batch_integrity row for bytes that are not a batch (CORRUPT_MESSAGE, as the broker)."""
    code = error_codes.CORRUPT_MESSAGE
    message = f"Record batch in topic partition {topic}-{partition} is corrupt: {detail}"
    return (
        topic, partition, offset, None, None, None, "batch_integrity", code,
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
        produced = ProducedRecords(
            topic=topic,
            partition=partition,
            raw=view,
            batches=(batch,),
            produce_version=LATEST_PRODUCE_VERSION if batch.magic == 2 else LEGACY_PRODUCE_VERSION,
            acks=-1,
            transactional_id=None,
            compacted=compacted,
            now_ms=task.settings.now_ms,
            stored=True,
            topic_config=topic_config,
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
        60_000, 300_000, 900_000, 3_600_000, 6 * 3_600_000, 86_400_000, 7 * 86_400_000,
        30 * 86_400_000, 365 * 86_400_000,
    ):  # fmt: skip
        if span / size <= buckets:
            return size
    return math.ceil(span / buckets)
