"""The schema ids the audited records carry, looked up once on the driver for every executor.

As the proxy gathers a request's ids before its chains run, the audit gathers them before its
check pass, with the same function (`kvproxy.policies.schemas.ids.schema_ids_wanted`): it cannot
ask the registry from thousands of tasks, so a first, cheap pass reads the records of topics
whose rule needs schemas (`Need.SCHEMAS`), each task keeping a set of the ids it saw, and the
driver merges them, looks each up once (`RegistryCatalog`) and ships the answers to the
executors as a `StaticCatalog` (`AuditSettings.schemas`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvproxy.pipeline import files
from kvproxy.pipeline.check import LATEST_PRODUCE_VERSION, batch_frames, stored_batch
from kvproxy.pipeline.segments import JournalSegment, SegmentRange
from kvproxy.pipeline.task_data import AuditSettings, routing_for
from kvproxy.policies.api import Need, ProducedRecords, Verdict, parse_records
from kvproxy.policies.chain import PolicyChain
from kvproxy.policies.config import TopicRouting
from kvproxy.policies.schemas.ids import schema_ids_wanted
from kvproxy.policies.schemas.model import RegisteredSchema, RegistryUnavailable, UnknownSchema
from kvproxy.protocol.errors import DecodeError
from kvproxy.protocol.journal import iter_entries
from kvproxy.protocol.records import read_batch
from kvproxy.registry.catalog import RegistryCatalog
from kvproxy.settings.schema_registry import SchemaRegistryConfig

__all__ = [
    "MAX_SCHEMA_IDS",
    "Answers",
    "SchemaLookups",
    "fetch_answers",
    "merge_ids",
    "needs_ids",
    "schema_ids_of_units",
]

MAX_SCHEMA_IDS = 100_000
"""Distinct ids one audit looks up at most: more means the data is not framed by a schema
registry at all (random bytes that start with 0), and looking them up would take hours."""

Answers = dict[int, RegisteredSchema | UnknownSchema | RegistryUnavailable]


@dataclass(frozen=True, slots=True)
class SchemaLookups:
    """What the driver's lookups gave, for the summary: ids found, unknown, not looked up."""

    ids: int
    found: int
    unknown: int
    unavailable: int
    on_error: str
    first_failure: str | None
    """Why the first id that could not be looked up could not be (the registry's failure)."""

    @classmethod
    def of(cls, answers: Mapping[int, object], on_error: str) -> SchemaLookups:
        failures = [a for a in answers.values() if isinstance(a, RegistryUnavailable)]
        return cls(
            ids=len(answers),
            found=sum(isinstance(a, RegisteredSchema) for a in answers.values()),
            unknown=sum(isinstance(a, UnknownSchema) for a in answers.values()),
            unavailable=len(failures),
            on_error=on_error,
            first_failure=min(failures, key=lambda a: a.schema_id).reason if failures else None,
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "ids": self.ids,
            "found": self.found,
            "unknown": self.unknown,
            "unavailable": self.unavailable,
            "on_error": self.on_error,
            "first_failure": self.first_failure,
        }


def needs_ids(unit: object, routing: TopicRouting) -> bool:
    """Whether the id pass reads `unit`: a range of a topic whose rule needs schemas, or a
    journal segment (its entries name their topics)."""
    from kvproxy.pipeline.live import LiveRange  # noqa: PLC0415  (kept off the executors' imports)

    if isinstance(unit, JournalSegment):
        return True
    if isinstance(unit, SegmentRange | LiveRange):
        return _schema_chain(routing, unit.topic) is not None
    return False  # corrupt regions hold no records; planning errors are reported as they are


def _schema_chain(routing: TopicRouting, topic: str) -> PolicyChain | None:
    """`topic`'s chain when it reads schema ids; else None."""
    chain = routing.rule_for(topic).chain
    return chain if Need.SCHEMAS in chain.needs else None


def merge_ids(left: frozenset[int], right: frozenset[int]) -> frozenset[int]:
    """Two tasks' ids; past `MAX_SCHEMA_IDS` + 1 the rest are dropped (the driver refuses)."""
    merged = left | right
    if len(merged) > MAX_SCHEMA_IDS:
        merged = frozenset(sorted(merged)[: MAX_SCHEMA_IDS + 1])
    return merged


class _Collector:
    """One task's ids, bounded, and its record budget (`--sample`)."""

    def __init__(self, settings: AuditSettings) -> None:
        self.routing = routing_for(settings)
        self.ids: set[int] = set()
        self.budget = settings.sample_per_unit
        self.chains: dict[str, PolicyChain | None] = {}

    @property
    def done(self) -> bool:
        return len(self.ids) > MAX_SCHEMA_IDS or (self.budget is not None and self.budget <= 0)

    def chain_of(self, topic: str) -> PolicyChain | None:
        if topic not in self.chains:
            self.chains[topic] = _schema_chain(self.routing, topic)
        return self.chains[topic]

    def add(self, chain: PolicyChain, produced: ProducedRecords) -> None:
        self.ids |= schema_ids_wanted(chain, produced)
        if self.budget is not None:
            self.budget -= sum(max(batch.record_count, 0) for batch in produced.batches)


def schema_ids_of_units(units: Iterable[Any], settings: AuditSettings) -> frozenset[int]:
    """The task body of the id pass: the distinct ids in the records of `units` (at most
    `MAX_SCHEMA_IDS` + 1). Bytes that do not read are skipped: the check pass reports them."""
    collector = _Collector(settings)
    for unit in units:
        if len(collector.ids) > MAX_SCHEMA_IDS:
            break
        collector.budget = settings.sample_per_unit  # as the check pass: per unit
        try:
            _collect(collector, unit)
        except Exception as exc:
            if type(exc).__name__ not in ("InputError", "LiveSourceError") and not isinstance(
                exc, (OSError, DecodeError)
            ):
                raise
    return frozenset(collector.ids)


def _collect(collector: _Collector, unit: Any) -> None:
    if isinstance(unit, JournalSegment):
        _collect_journal(collector, unit)
        return
    chain = collector.chain_of(unit.topic)
    if chain is None:
        return
    if isinstance(unit, SegmentRange):
        data = files.read_range(unit.uri, unit.start, unit.end)
        views = (view for _, view in batch_frames(data, unit.start))
    else:
        from kvproxy.pipeline.live import fetch_batches  # noqa: PLC0415  (only live audits need it)

        views = (memoryview(raw) for raw in fetch_batches(unit))
    for view in views:
        if collector.done:
            return
        try:
            batch, _ = read_batch(view)
            if not batch.is_control:
                collector.add(chain, stored_batch(unit.topic, unit.partition, view, batch))
        except DecodeError:
            continue


def _collect_journal(collector: _Collector, unit: JournalSegment) -> None:
    with files.open_binary(unit.uri) as handle:
        data = handle.read()
    for _, _, metadata, records in iter_entries(data):
        if collector.done:
            return
        chain = collector.chain_of(str(metadata.get("topic", "")))
        if chain is None or metadata.get("kind") not in ("rejected", "warned"):
            continue
        parsed = parse_records(
            str(metadata.get("topic", "")),
            int(metadata.get("partition", -1)),
            records,
            produce_version=LATEST_PRODUCE_VERSION,
            acks=-1,
            transactional_id=None,
            compacted=None,
            now_ms=0,
        )
        if isinstance(parsed, Verdict):
            continue
        try:
            collector.add(chain, parsed)
        except DecodeError:
            continue


async def _fetch(config: SchemaRegistryConfig, ids: list[int]) -> Answers:
    # The proxy's catalog forgets the oldest ids past cache_max_schemas: here it holds them all.
    driver_config = config.model_copy(
        update={"cache_max_schemas": max(config.cache_max_schemas, len(ids), 1)}
    )
    catalog = RegistryCatalog(driver_config)
    chunk = config.max_lookups_per_request  # what one `fetch` looks up at most
    try:
        for start in range(0, len(ids), chunk):
            await catalog.fetch(ids[start : start + chunk])
        return catalog.answers()
    finally:
        await catalog.aclose()


def fetch_answers(config: SchemaRegistryConfig, ids: Iterable[int]) -> Answers:
    """What the registry says about each of `ids` (found, unknown, or why it could not say),
    each asked once, `max_lookups_per_request` at a time."""
    return asyncio.run(_fetch(config, sorted(set(ids))))
