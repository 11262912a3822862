"""The audit job: plan the work, run the policies on Spark, write violations, summary and report.

Stages: (1) the driver lists the inputs and, for a live topic, asks the cluster for partition
offsets; (2) one Spark stage reads each segment's batch headers and cuts it into ranges; (3) one
stage checks every range, journal segment and live offset range (`kvproxy.pipeline.check`); (4) the
violations are written as Parquet and summarised with Spark SQL; the driver writes
`summary.json` and `report.html` and prints a console summary (`kvproxy.pipeline.outputs`).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from kvproxy.pipeline import files
from kvproxy.pipeline.check import check_unit
from kvproxy.pipeline.outputs import human_size, print_summary, summarise, write_outputs
from kvproxy.pipeline.progress import Progress, spark_output_to
from kvproxy.pipeline.schema_ids import (
    MAX_SCHEMA_IDS,
    SchemaLookups,
    fetch_answers,
    merge_ids,
    needs_ids,
    schema_ids_of_units,
)
from kvproxy.pipeline.segments import (
    RANGE_BYTES,
    CorruptRegion,
    JournalSegment,
    OffsetDisorder,
    SegmentFile,
    SegmentRange,
    discover,
    plan_segment,
)
from kvproxy.pipeline.summary import (
    SAMPLE_ROWS,
    grouped_by_spark,
    grouped_locally,
    samples_locally,
    write_locally,
)
from kvproxy.pipeline.task_data import VIOLATION_FIELDS, AuditSettings, PartitionStats, routing_for
from kvproxy.policies import plugins
from kvproxy.policies.api import Need
from kvproxy.policies.errors import PolicyConfigError
from kvproxy.registry.catalog import StaticCatalog
from kvproxy.settings.audit_file import read_audit_file
from kvproxy.settings.loading import ConfigError
from kvproxy.settings.schema_registry import (
    SchemaRegistryConfig,
)

__all__ = ["AuditError", "AuditRequest", "captures_spark_output", "load_settings", "run_audit"]

LOCAL_SUMMARY_ROWS = 100_000
"""Violations up to this many are summarised on the driver from memory (a few MB) rather than
by Spark queries over the written files, which cost seconds each whatever the row count."""
"""Violations shown in the report (and kept in summary.json's neighbour, the Parquet, in full)."""


class AuditError(Exception):
    """The audit cannot run as asked; the message says why."""


@dataclass(frozen=True, slots=True)
class AuditRequest:
    """What `kvproxy audit` was asked to do."""

    output: str
    inputs: tuple[str, ...] = ()
    config: str | None = None
    bootstrap: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    start: Any = None
    """`kvproxy.pipeline.live.OffsetSpec` for live topics: an offset, a Timestamp, or None
    (earliest)."""
    end: Any = None
    sample: int | None = None
    now_ms: int | None = None
    range_bytes: int = RANGE_BYTES
    master: str = "local[*]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    spark_logs: str | None = None
    """The file Spark's own output (its log lines, its warnings) goes to when the audit starts
    Spark; None: the console, with the audit's lines."""


def load_settings(config: str | None, now_ms: int) -> AuditSettings:
    """The policy sections of a proxy config (the rest is the proxy's), checked on the driver."""
    if config is None:
        return AuditSettings(
            defaults=None,
            topics=None,
            base_dir=str(Path.cwd()),
            now_ms=now_ms,
            policies=_policy_targets(),
            default_policies=_default_policies(),
        )
    targets = _policy_targets()
    try:
        read = read_audit_file(Path(config), targets)
    except ConfigError as exc:
        raise AuditError(str(exc)) from None
    read.routing.close()  # the executors build their own (`routing_for`)
    return AuditSettings(
        defaults=read.rules.defaults,
        topics=read.rules.topics,
        base_dir=str(read.base_dir),
        profile=read.profile,
        now_ms=now_ms,
        policies=targets,
        default_policies=_default_policies(),
        schema_registry=read.schema_registry,
    )


def _default_policies() -> tuple[str, ...]:
    """The installed default chain, found here on the driver for the executors."""
    try:
        return plugins.default_policies()
    except PolicyConfigError as exc:
        raise AuditError(str(exc)) from None


def _policy_targets() -> dict[str, str]:
    """The installed policies by name, found here on the driver for the executors."""
    try:
        return plugins.entry_point_targets()
    except PolicyConfigError as exc:
        raise AuditError(str(exc)) from None


def run_audit(
    request: AuditRequest,
    spark: Any = None,
    *,
    out: IO[str] | None = None,
    summary_out: IO[str] | None = None,
) -> dict[str, Any]:
    """Run one audit; returns the summary (also written to `<output>/summary.json`).

    Progress goes to `out` (stderr by default), the final summary to `summary_out` (stdout by
    default): the result is what a caller pipes or captures, the progress is not."""
    return _run_audit(request, spark, Progress(out or sys.stderr), summary_out or sys.stdout)


def captures_spark_output(request: AuditRequest, spark: Any) -> str | None:
    """The file Spark's output goes to, when this run starts Spark's JVM itself (its stderr is
    pointed there before it starts); None with a session given, or under spark-submit, whose
    JVM started this process and keeps the console."""
    if spark is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return None
    return request.spark_logs


def _run_audit(
    request: AuditRequest, spark: Any, progress: Progress, summary_out: IO[str]
) -> dict[str, Any]:
    started = time.time()
    now_ms = request.now_ms if request.now_ms is not None else int(started * 1000)
    settings = load_settings(request.config, now_ms)
    if not request.inputs and not request.topics:
        raise AuditError("nothing to audit: give --input paths and/or --bootstrap with --topic")
    if request.topics and not request.bootstrap:
        raise AuditError("--topic needs --bootstrap HOST:PORT to reach the cluster")

    found: list[SegmentFile | JournalSegment] = []
    for uri in request.inputs:
        try:
            found.extend(discover(files.absolute(uri)))
        except files.InputError as exc:
            raise AuditError(str(exc)) from exc
    segments = [f for f in found if isinstance(f, SegmentFile)]
    journal = [f for f in found if isinstance(f, JournalSegment)]
    live_units: list[Any] = []
    if request.bootstrap:
        from kvproxy.client.blocking import (  # noqa: PLC0415  (only needed with a cluster)
            LiveSourceError,
            describe_compaction,
        )
        from kvproxy.pipeline.live import plan_live_ranges  # noqa: PLC0415

        names = sorted({s.topic for s in segments} | set(request.topics))
        try:
            compaction = describe_compaction(list(request.bootstrap), names) if names else {}
            for topic in request.topics:
                live_units.extend(
                    plan_live_ranges(list(request.bootstrap), topic, request.start, request.end)
                )
        except LiveSourceError as exc:
            raise AuditError(str(exc)) from exc
        settings = replace(
            settings, compaction=dict(compaction), bootstrap=tuple(request.bootstrap)
        )
    progress.stage(
        f"inputs: {len(segments)} segment files, {len(journal)} journal segments, "
        f"{len(live_units)} live offset ranges",
    )

    own_session = spark is None
    with contextlib.ExitStack() as stack:
        if spark is None:
            spark = _start_spark(request, progress, stack)
        try:
            return _run_on_spark(
                spark,
                request,
                settings,
                segments=segments,
                journal=journal,
                live_units=live_units,
                started=started,
                progress=progress,
                summary_out=summary_out,
            )
        finally:
            if own_session:
                spark.stop()


def _start_spark(request: AuditRequest, progress: Progress, stack: contextlib.ExitStack) -> Any:
    """A SparkSession for this run; Spark's own output goes to its file from before its JVM
    starts until the stack closes (after the session stops)."""
    from kvproxy.pipeline.spark import SparkUnavailable, start_session  # noqa: PLC0415

    captured = captures_spark_output(request, None)
    if captured:
        console = stack.enter_context(spark_output_to(Path(captured)))
        if progress.out is sys.stderr:  # now the file: the audit's lines go on to the console
            progress.out = console
        progress.stage(f"Spark's own output goes to {captured}")
    try:
        return start_session(request.master, request.spark_conf)
    except SparkUnavailable as exc:
        raise AuditError(str(exc)) from exc


def _plan(segment: SegmentFile, range_bytes: int) -> list[Any]:
    try:
        return list(plan_segment(segment, range_bytes))
    except files.InputError as exc:
        return [("error", str(exc))]


def _run_units(units: Iterable[Any], settings: AuditSettings) -> Iterator[tuple[str, Any]]:
    """The task body: ("v", violation), ("s", stats) or ("e", input error) per item."""
    for unit in units:
        if isinstance(unit, tuple):  # a planning error carried through
            yield "e", unit[1]
            continue
        try:
            rows, stats = check_unit(unit, settings)
        except Exception as exc:
            if type(exc).__name__ not in ("InputError", "LiveSourceError") and not isinstance(
                exc, OSError
            ):
                raise
            yield "e", str(exc)
            continue
        for row in rows:
            yield "v", row
        for item in stats:
            yield "s", item


def _run_on_spark(
    spark: Any,
    request: AuditRequest,
    settings: AuditSettings,
    *,
    segments: Sequence[SegmentFile],
    journal: Sequence[JournalSegment],
    live_units: Sequence[Any],
    started: float,
    progress: Progress,
    summary_out: IO[str],
) -> dict[str, Any]:
    from pyspark import StorageLevel  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: N812, PLC0415
    from pyspark.sql.types import StructField, StructType, _parse_datatype_string  # noqa: PLC0415

    sc = spark.sparkContext
    clock = [time.perf_counter()]
    phases = {"starting": time.time() - started}  # the session, listing the inputs
    units: list[Any] = []
    if segments:
        progress.stage(f"planning: reading batch headers of {len(segments)} segment files")
        range_bytes = request.range_bytes
        slices = min(len(segments), sc.defaultParallelism * 4)
        with progress.tasks(sc, "planning"):
            planned = (
                sc.parallelize(list(segments), slices)
                .flatMap(lambda segment: _plan(segment, range_bytes))
                .collect()
            )
        units.extend(planned)
    units.extend(journal)
    units.extend(live_units)
    ranges = [u for u in units if isinstance(u, SegmentRange)]
    regions = [u for u in units if isinstance(u, CorruptRegion)]
    disorders = [u for u in units if isinstance(u, OffsetDisorder)]
    planned_bytes = sum(r.end - r.start for r in ranges)
    progress.stage(
        f"checking: {len(ranges)} ranges ({human_size(planned_bytes)}), {len(regions)} corrupt "
        f"regions, {len(disorders)} batches out of offset order, {len(journal)} journal "
        f"segments, {len(live_units)} live ranges",
    )
    if request.sample is not None:
        per_unit = max(1, math.ceil(request.sample / max(len(units), 1)))
        settings = replace(settings, sample_per_unit=per_unit)
    phases["planning"] = _lap(clock)
    registry = settings.schema_registry
    settings = replace(settings, schema_registry=None)  # its credentials stay on the driver
    lookups: SchemaLookups | None = None
    if registry is not None and routing_for(settings).rules_needing(Need.SCHEMAS):
        settings, lookups = _look_up_schema_ids(sc, units, settings, registry, progress)
        phases["schema_ids"] = _lap(clock)

    checked = (
        sc.parallelize(units, max(len(units), 1))
        .mapPartitions(lambda part: _run_units(part, settings))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        with progress.tasks(sc, "checking"):
            outcome = checked.filter(lambda item: item[0] != "v").collect()
        stats: dict[tuple[str, int], PartitionStats] = {}
        errors: list[str] = []
        for kind, value in outcome:
            if kind == "e":
                errors.append(value)
                continue
            key = (value.topic, value.partition)
            if key in stats:
                stats[key].merge(value)
            else:
                stats[key] = value
        schema = StructType(
            [StructField(name, _parse_datatype_string(kind)) for name, kind in VIOLATION_FIELDS]
        )
        phases["checking"] = _lap(clock)
        rows = checked.filter(lambda item: item[0] == "v").map(lambda item: item[1])
        violations_dir = request.output.rstrip("/") + "/violations"
        progress.stage(f"writing violations to {violations_dir}")
        local: list[Any] | None = None
        if sum(item.violations for item in stats.values()) <= LOCAL_SUMMARY_ROWS:
            # Few rows: summarised here, from memory, and written as one file; no Spark query
            # reads them back (each took seconds of job overhead for a handful of rows).
            local = rows.collect()
        if local is None or not write_locally(violations_dir, local):
            # One task per unit is right for checking; for writing it would mean one small
            # Parquet file (and ~30 ms of task overhead) per unit: the cached rows are merged.
            source = rows if local is None else local
            frame = spark.createDataFrame(source, schema).coalesce(max(1, sc.defaultParallelism))
            frame.write.mode("overwrite").parquet(violations_dir)
        phases["writing"] = _lap(clock)
    finally:
        checked.unpersist()

    if local is not None:
        bucket, grouped = grouped_locally(local)
        samples = samples_locally(local)
    else:
        frame = spark.read.parquet(violations_dir)
        bucket, grouped = grouped_by_spark(frame, F)
        samples = [
            row.asDict()
            for row in frame.orderBy("topic", "partition", "offset", "position")
            .limit(SAMPLE_ROWS)
            .collect()
        ]
    summary = summarise(
        bucket,
        grouped,
        request,
        settings,
        stats=stats,
        errors=errors,
        lookups=lookups,
        started=started,
    )
    phases["summarising"] = _lap(clock)
    summary["phases_s"] = {name: round(seconds, 3) for name, seconds in phases.items()}
    write_outputs(request.output, summary, samples)
    print_summary(summary_out, summary, request.output)
    return summary


def _look_up_schema_ids(
    sc: Any,
    units: Sequence[Any],
    settings: AuditSettings,
    registry: SchemaRegistryConfig,
    progress: Progress,
) -> tuple[AuditSettings, SchemaLookups]:
    """A first pass collects the distinct schema ids of the records the schema policies read;
    the driver looks each up once and the settings carry the answers to the executors."""
    routing = routing_for(settings)
    readable = [unit for unit in units if needs_ids(unit, routing)]
    ids: frozenset[int] = frozenset()
    if readable:
        progress.stage(f"schema ids: reading the record headers of {len(readable)} units")
        with progress.tasks(sc, "schema ids"):
            ids = (
                sc.parallelize(readable, len(readable))
                .mapPartitions(lambda part: [schema_ids_of_units(part, settings)])
                .treeReduce(merge_ids)
            )
    if len(ids) > MAX_SCHEMA_IDS:
        raise AuditError(
            f"the records of the topics the schema policy checks carry more than "
            f"{MAX_SCHEMA_IDS} distinct schema ids: they are not framed by a schema registry "
            "(check the topics that rule matches, or audit fewer at a time)"
        )
    progress.stage(f"schema registry: looking up {len(ids)} schema ids at {registry.url[0]}")
    answers = fetch_answers(registry, ids)
    lookups = SchemaLookups.of(answers, registry.on_error)
    if lookups.unavailable:
        progress.stage(
            f"schema registry: {lookups.unavailable} of {lookups.ids} schema ids could not be "
            f"looked up (on_error: {lookups.on_error}): {lookups.first_failure}",
        )
    catalog = StaticCatalog(answers, accept_unavailable=registry.on_error == "accept")
    return replace(settings, schemas=catalog), lookups


def _lap(clock: list[float]) -> float:
    """Seconds since the last lap (`clock[0]`), which becomes now."""
    now = time.perf_counter()
    seconds, clock[0] = now - clock[0], now
    return seconds
