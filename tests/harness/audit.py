"""Running the Spark audit in a test: a config file in a folder, and `run_audit` with its summary
and violation rows read back."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from kvproxy.pipeline.job import AuditRequest, run_audit


def write_config(folder: Path, text: str) -> str:
    path = folder / "kvproxy.yaml"
    path.write_text(text)
    return str(path)


def audit(
    spark: Any, tmp_path: Path, *, out: io.StringIO | None = None, **kwargs: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the audit; what it prints (progress and the final summary) goes to `out` when given."""
    output = tmp_path / "out"
    sink = out or io.StringIO()
    summary = run_audit(
        AuditRequest(output=str(output), **kwargs), spark, out=sink, summary_out=sink
    )
    rows = [row.asDict() for row in spark.read.parquet(str(output / "violations")).collect()]
    assert json.loads((output / "summary.json").read_text()) == summary
    return summary, rows
