"""The violations counted for the summary: by Spark queries over the written files, or on the
driver from rows held in memory when they are few. Both give the same groups and samples."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvproxy.pipeline import files
from kvproxy.pipeline.check import bucket_size_ms
from kvproxy.pipeline.task_data import VIOLATION_FIELDS

__all__ = [
    "SAMPLE_ROWS",
    "GroupKey",
    "grouped_by_spark",
    "grouped_locally",
    "samples_locally",
    "write_locally",
]

SAMPLE_ROWS = 200
"""Violations shown in the report's table (the first by topic, partition, offset, position)."""

GroupKey = tuple[str, str, str, int, str, int | None]
"""topic, policy, error_name, error_code, mode, the start of its timeline bucket (None: no
timestamp)."""


def grouped_by_spark(frame: Any, F: Any) -> tuple[int, list[tuple[GroupKey, int]]]:  # noqa: N803
    """The timeline's bucket and the violations counted by `GroupKey`, by Spark queries."""
    # The timeline's buckets cut the violations' own time span, not the records': an hour of
    # violations in a year of records is still many bars.
    span = frame.agg(F.min("timestamp").alias("low"), F.max("timestamp").alias("high")).first()
    low, high = (span["low"], span["high"]) if span is not None else (None, None)
    bucket = bucket_size_ms(low or 0, high or 0)
    # One query for every breakdown: the groups are few (topics x policies x codes x modes x
    # buckets).
    start = (F.floor(F.col("timestamp") / bucket) * bucket).alias("start")
    grouped = frame.groupBy("topic", "policy", "error_name", "error_code", "mode", start).count()
    return bucket, [
        (
            (
                row["topic"],
                row["policy"],
                row["error_name"],
                int(row["error_code"]),
                row["mode"],
                None if row["start"] is None else int(row["start"]),
            ),
            int(row["count"]),
        )
        for row in grouped.collect()
    ]


_AT = {name: index for index, (name, _kind) in enumerate(VIOLATION_FIELDS)}


def grouped_locally(rows: Sequence[Sequence[Any]]) -> tuple[int, list[tuple[GroupKey, int]]]:
    """As `grouped_by_spark`, over rows held in memory."""
    at = _AT
    stamps = [row[at["timestamp"]] for row in rows if row[at["timestamp"]] is not None]
    bucket = bucket_size_ms(min(stamps, default=0), max(stamps, default=0))
    counts: Counter[GroupKey] = Counter()
    for row in rows:
        stamp = row[at["timestamp"]]
        counts[
            (
                row[at["topic"]],
                row[at["policy"]],
                row[at["error_name"]],
                int(row[at["error_code"]]),
                row[at["mode"]],
                None if stamp is None else stamp // bucket * bucket,
            )
        ] += 1
    return bucket, list(counts.items())


def samples_locally(rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """The first SAMPLE_ROWS rows in the order Spark's `orderBy` gives (nulls first)."""
    at = _AT

    def order(row: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(
            (row[at[name]] is not None, row[at[name]] if row[at[name]] is not None else 0)
            for name in ("topic", "partition", "offset", "position")
        )

    names = [name for name, _kind in VIOLATION_FIELDS]
    return [dict(zip(names, row, strict=True)) for row in sorted(rows, key=order)[:SAMPLE_ROWS]]


_ARROW_TYPES = {"string": "string", "int": "int32", "long": "int64"}


def write_locally(directory: str, rows: Sequence[Sequence[Any]]) -> bool:
    """`rows` as `violations/` in the layout Spark writes (one `part-*.parquet`, `_SUCCESS`),
    with pyarrow, in this process: for a local output and few rows this takes milliseconds where
    a Spark write takes seconds (its SQL engine starts). False when `directory` is not local or
    pyarrow is not installed: the caller writes with Spark."""
    path = files.local_path(directory)
    if path is None:
        return False
    try:
        import pyarrow as pa  # noqa: PLC0415
        import pyarrow.parquet as pq  # noqa: PLC0415
    except ImportError:
        return False
    schema = pa.schema(
        [pa.field(name, getattr(pa, _ARROW_TYPES[kind])()) for name, kind in VIOLATION_FIELDS]
    )
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(VIOLATION_FIELDS)
    table = pa.table(
        [
            pa.array(list(column), type=field.type)
            for column, field in zip(columns, schema, strict=True)
        ],
        schema=schema,
    )
    folder = Path(path)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "part-00000-kvproxy.snappy.parquet", compression="snappy")
    (folder / "_SUCCESS").write_bytes(b"")
    return True
