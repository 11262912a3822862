"""The audit's console (kvproxy.pipeline.progress): stage lines everywhere, one updating task line
on a terminal only, and Spark's own output sent to a file."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from kvproxy.pipeline.job import AuditRequest, captures_spark_output
from kvproxy.pipeline.progress import Progress

STAGE_LINE = r"\[\d\d:\d\d:\d\d\] "


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@dataclass
class StageInfo:
    numCompletedTasks: int  # noqa: N815  (Spark's names)
    numTasks: int  # noqa: N815


class Tracker:
    """What `SparkContext.statusTracker()` answers: one running stage, 2 of 4 tasks done."""

    def getActiveStageIds(self) -> list[int]:  # noqa: N802
        return [7]

    def getStageInfo(self, stage_id: int) -> StageInfo | None:  # noqa: N802
        return StageInfo(2, 4) if stage_id == 7 else None


class SparkContext:
    def statusTracker(self) -> Tracker:  # noqa: N802
        return Tracker()


def _wait_until(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_terminal_gets_one_updating_task_line_cleared_before_the_next_stage() -> None:
    out = Terminal()
    progress = Progress(out)
    with progress.tasks(SparkContext(), "checking"):
        _wait_until(lambda: "checking: 2/4 tasks" in out.getvalue())
    progress.stage("writing violations to out/violations")
    # Drawn once (redrawn only when it changes), cleared, then the stage line in its place.
    assert re.fullmatch(
        r"\r\x1b\[2K  checking: 2/4 tasks\r\x1b\[2K"
        + STAGE_LINE
        + r"writing violations to out/violations\n",
        out.getvalue(),
    ), repr(out.getvalue())


def test_a_pipe_gets_plain_stage_lines_only() -> None:
    out = io.StringIO()
    progress = Progress(out)
    progress.stage("planning: reading batch headers of 4 segment files")
    with progress.tasks(SparkContext(), "planning"):
        progress.show_tasks("planning", 1, 4)
    progress.stage("checking: 4 ranges")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("] planning: reading batch headers of 4 segment files")
    assert lines[1].endswith("] checking: 4 ranges")
    assert "\r" not in out.getvalue() and "tasks" not in out.getvalue()


def test_spark_output_goes_to_the_file_and_the_audit_lines_to_the_console(tmp_path: Path) -> None:
    """File descriptor 2 is what a JVM started in the block inherits; the audit writes on."""
    log = tmp_path / "spark.log"
    script = f"""
import os, subprocess, sys
from pathlib import Path
from kvproxy.pipeline.progress import spark_output_to
with spark_output_to(Path({str(log)!r})) as console:
    subprocess.run(["sh", "-c", "echo 'WARN NativeCodeLoader: from a child' >&2"], check=True)
    os.write(2, b"WARNING: Using incubator modules\\n")
    print("[00:00:00] inputs: 1 segment file", file=console)
print("after the block", file=sys.stderr)
"""
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert run.stderr == "[00:00:00] inputs: 1 segment file\nafter the block\n"
    assert log.read_text() == (
        "WARN NativeCodeLoader: from a child\nWARNING: Using incubator modules\n"
    )


def test_spark_output_is_captured_only_when_the_audit_starts_the_jvm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    request = AuditRequest(output="out", spark_logs="/tmp/spark.log")
    assert captures_spark_output(request, None) == "/tmp/spark.log"
    assert captures_spark_output(request, object()) is None  # a session given: its JVM runs
    assert captures_spark_output(replace(request, spark_logs=None), None) is None  # --spark-logs
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "40000")  # spark-submit started this process
    assert captures_spark_output(request, None) is None
