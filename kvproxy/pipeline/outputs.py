"""What the audit job leaves when it is done: the summary (`summary.json`), the HTML report
next to it, and the console lines, built on the driver from the counted violations and the
partitions' figures."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

from kvproxy.pipeline import files
from kvproxy.pipeline.schema_ids import SchemaLookups
from kvproxy.pipeline.summary import GroupKey
from kvproxy.pipeline.task_data import AuditSettings, PartitionStats, routing_for

if TYPE_CHECKING:
    from kvproxy.pipeline.job import AuditRequest

__all__ = ["batch_counts", "human_size", "print_summary", "summarise", "write_outputs"]


def _iso(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def summarise(
    bucket: int,
    grouped: Sequence[tuple[GroupKey, int]],
    request: AuditRequest,
    settings: AuditSettings,
    *,
    stats: Mapping[tuple[str, int], PartitionStats],
    errors: list[str],
    lookups: SchemaLookups | None,
    started: float,
) -> dict[str, Any]:
    """The summary.json document: the violations by policy, topic, mode, code and time bucket,
    and the figures of every partition read."""
    routing = routing_for(settings)
    firsts = [s.first_ms for s in stats.values() if s.first_ms is not None]
    lasts = [s.last_ms for s in stats.values() if s.last_ms is not None]
    first_ms = min(firsts) if firsts else None
    last_ms = max(lasts) if lasts else None
    total = untimed = 0
    by_policy: Counter[str] = Counter()
    by_topic: Counter[str] = Counter()
    by_mode: Counter[str] = Counter()
    by_code: dict[str, dict[str, int]] = {}
    buckets: dict[int, Counter[str]] = {}
    for (topic, policy, error_name, error_code, mode, start), count in grouped:
        total += count
        by_policy[policy] += count
        by_topic[topic] += count
        by_mode[mode] += count
        code = by_code.setdefault(error_name, {"code": error_code, "count": 0})
        code["count"] += count
        if start is not None:
            buckets.setdefault(start, Counter())[policy] += count
        else:
            untimed += count
    timeline = {
        "bucket_ms": bucket if buckets else 0,
        "buckets": [{"start_ms": k, "counts": dict(buckets[k])} for k in sorted(buckets)],
        "untimed": untimed,
    }
    partitions: dict[str, Any] = {}
    for (topic, partition), item in sorted(stats.items()):
        rule = routing.rule_for(topic)
        partitions[f"{topic}-{partition}"] = {
            "topic": topic,
            "partition": partition,
            "records": item.records,
            "data_batches": item.batches,
            "batches": item.batches,
            "bytes": item.bytes,
            "control_batches": item.control_batches,
            "violations": item.violations,
            "mode": rule.mode.value,
            "policies": list(rule.policy_names),
            "compacted": item.compacted,
            "first_ms": item.first_ms,
            "last_ms": item.last_ms,
        }
    finished = time.time()
    inputs = list(request.inputs) + [
        f"kafka://{request.bootstrap[0]}/{topic}" for topic in request.topics
    ]
    return {
        "title": "kvproxy audit",
        "started": _iso(started * 1000),
        "finished": _iso(finished * 1000),
        "duration_s": round(finished - started, 3),
        "inputs": inputs,
        "config": request.config,
        "sample": request.sample,
        "now_ms": settings.now_ms,
        "records_scanned": sum(s.records for s in stats.values()),
        "data_batches": sum(s.batches for s in stats.values()),
        "batches_scanned": sum(s.batches for s in stats.values()),
        "control_batches": sum(s.control_batches for s in stats.values()),
        "bytes_scanned": sum(s.bytes for s in stats.values()),
        "violations": total,
        "violations_by_mode": {mode: by_mode.get(mode, 0) for mode in ("enforce", "warn")},
        "violations_by_policy": dict(by_policy),
        "violations_by_topic": dict(by_topic),
        "violations_by_code": by_code,
        "partitions": partitions,
        "time_range": {"first_ms": first_ms, "last_ms": last_ms},
        "timeline": timeline,
        "errors": errors,
        "schema_registry": None if lookups is None else lookups.as_json(),
    }


def write_outputs(output: str, summary: Mapping[str, Any], samples: list[dict[str, Any]]) -> None:
    from kvproxy.pipeline.report import render_report  # noqa: PLC0415

    files.write_text(output.rstrip("/") + "/summary.json", json.dumps(summary, indent=2) + "\n")
    files.write_text(output.rstrip("/") + "/report.html", render_report(summary, samples))


def human_size(size: float) -> str:
    """Bytes as the console shows them ("512 B", "1.5 MiB")."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


def batch_counts(summary: Mapping[str, Any]) -> str:
    """Data and control batches, apart: a control batch (transaction marker) is the broker's
    own, counted but never checked, and is not among the data batches."""
    control = summary["control_batches"]
    text = f"{summary['data_batches']} data batches"
    if control:
        text += f" + {control} control batch{'es' if control != 1 else ''} (not checked)"
    return text


def print_summary(out: IO[str], summary: Mapping[str, Any], output: str) -> None:
    by_mode = summary["violations_by_mode"]
    lines = [
        "",
        "kvproxy audit: "
        f"{summary['records_scanned']} records in {batch_counts(summary)} "
        f"({human_size(summary['bytes_scanned'])}) scanned in {summary['duration_s']:.1f} s",
        f"  violations: {summary['violations']} ({by_mode['enforce']} enforce: would be "
        f"refused; {by_mode['warn']} warn: would pass, logged)",
    ]
    for name, count in sorted(summary["violations_by_policy"].items(), key=lambda kv: -kv[1]):
        lines.append(f"    {name}: {count}")
    for name, item in sorted(summary["violations_by_code"].items(), key=lambda kv: -kv[1]["count"]):
        lines.append(f"    {name} ({item['code']}): {item['count']}")
    if summary["sample"] is not None:
        lines.append(f"  sampled: about {summary['sample']} records checked")
    lookups = summary.get("schema_registry")
    if lookups is not None:
        lines.append(
            f"  schema registry: {lookups['ids']} schema ids looked up, {lookups['found']} found, "
            f"{lookups['unknown']} unknown"
        )
        if lookups["unavailable"]:
            action = "records with them pass" if lookups["on_error"] == "accept" else "rejected"
            lines.append(
                f"    {lookups['unavailable']} could not be looked up ({action}, on_error: "
                f"{lookups['on_error']}): {lookups['first_failure']}"
            )
    for error in summary["errors"]:
        lines.append(f"  input error: {error}")
    lines.append(f"  written: {output}/violations/ (Parquet), summary.json, report.html")
    print("\n".join(lines), file=out, flush=True)
