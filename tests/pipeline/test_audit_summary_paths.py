"""Few violations are summarised on the driver from memory, many by Spark queries over the
written files: both give the same summary, the same sample rows and the same violations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvproxy.pipeline import job as audit_job
from kvproxy.pipeline.cli import parse_now
from tests.harness.audit import audit

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "audit"
VARIES = {"started", "finished", "duration_s", "phases_s"}


def _run(spark: Any, folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    summary, rows = audit(
        spark,
        folder,
        inputs=(str(REPO / "tests" / "data" / "kafka-logs"),),
        config=str(EXAMPLE / "kvproxy.yaml"),
        now_ms=parse_now("2026-11-22T00:00:00Z"),
    )
    report = (folder / "out" / "report.html").read_text()
    return summary, rows, report


def test_the_driver_and_spark_summaries_agree(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local, local_rows, local_report = _run(spark, tmp_path / "local")
    monkeypatch.setattr(audit_job, "LOCAL_SUMMARY_ROWS", 0)
    spark_summary, spark_rows, spark_report = _run(spark, tmp_path / "spark")

    assert local["violations"] > 0
    assert {k: v for k, v in local.items() if k not in VARIES} == {
        k: v for k, v in spark_summary.items() if k not in VARIES
    }
    assert set(local["phases_s"]) == {"starting", "planning", "checking", "writing", "summarising"}
    assert set(spark_summary["phases_s"]) == set(local["phases_s"])

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(str(row[name]) for name in sorted(row))

    assert sorted(local_rows, key=key) == sorted(spark_rows, key=key)
    # the sample table of the report lists the same rows in the same order
    marker = "<div class=table-wrap><table>"
    table = local_report[local_report.rindex(marker) :]
    assert "<td class=source>" in table
    assert table == spark_report[spark_report.rindex(marker) :]
