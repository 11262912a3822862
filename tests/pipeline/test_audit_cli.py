"""`kvproxy audit` as a user runs it: the command, its console output, its exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kvproxy.pipeline.spark import SparkUnavailable, find_java
from tests.harness.segments import TESTDATA_LOGS

REPO = Path(__file__).resolve().parents[2]


def kvproxy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_audit_command_end_to_end(tmp_path: Path) -> None:
    config = tmp_path / "kvproxy.yaml"
    config.write_text("topics:\n  - {match: cities, compacted: true}\n")
    out = tmp_path / "audit"
    run = kvproxy(
        "audit", "-c", str(config), "--input", str(TESTDATA_LOGS), "--output", str(out),
        "--master", "local[2]", "--fail-on-violations",
    )  # fmt: skip
    assert run.returncode == 3, run.stderr
    assert "inputs: 4 segment files, 0 journal segments" in run.stderr
    assert "checking: 4 ranges" in run.stderr
    # the result on stdout, where a pipe or a CI log capture takes it; progress stays on stderr
    assert run.stdout.startswith("\nkvproxy audit: 383 records in 383 data batches"), run.stdout
    assert "violations: 11 (11 enforce: would be refused; 0 warn: would pass, logged)" in run.stdout
    assert "compacted_key: 11" in run.stdout
    assert "written: " in run.stdout
    assert "kvproxy audit: 383 records" not in run.stderr
    assert "inputs:" not in run.stdout
    _assert_only_the_audits_own_lines(run)
    # Spark's own output went to the file named before Spark starts, in the temporary directory.
    second = run.stderr.splitlines()[1]
    match = re.fullmatch(r"\[\d\d:\d\d:\d\d\] Spark's own output goes to (.+)", second)
    assert match, second
    spark_log = Path(match[1])
    try:
        assert spark_log.parent == Path(tempfile.gettempdir())
        assert "log4j" in spark_log.read_text()
    finally:
        spark_log.unlink()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["violations"] == 11
    assert summary["config"] == str(config)
    assert list((out / "violations").glob("*.parquet"))
    assert "<svg" in (out / "report.html").read_text()


SPARK_LINES = re.compile(r"log4j|WARN|INFO|\[Stage \d|setLogLevel|incubator")


def _assert_only_the_audits_own_lines(run: subprocess.CompletedProcess[str]) -> None:
    """stderr holds the audit's progress, one stamped line per stage; neither stream holds a
    line of Spark's (its log lines, its JVM's warnings, its console progress bar)."""
    assert not SPARK_LINES.search(run.stdout), run.stdout
    for line in run.stderr.splitlines():
        assert re.match(r"\[\d\d:\d\d:\d\d\] [a-zA-Z]", line), line
        assert not SPARK_LINES.search(line), line
    messages = [line.split("] ", 1)[1] for line in run.stderr.splitlines()]
    wanted = ("inputs: ", "Spark's own output goes to ", "planning: ", "checking: ", "writing ")
    assert len(messages) == len(wanted), messages
    for message, start in zip(messages, wanted, strict=True):
        assert message.startswith(start), messages


def test_audit_shows_sparks_output_when_asked(tmp_path: Path) -> None:
    out = tmp_path / "audit"
    run = kvproxy(
        "audit", "--input", str(TESTDATA_LOGS), "--output", str(out), "--master", "local[2]",
        "--spark-logs",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "Spark's own output goes to" not in run.stderr
    assert "log4j" in run.stderr  # Spark's, as it writes them
    assert "] checking: 4 ranges" in run.stderr
    assert "[Stage " not in run.stderr  # Spark's console progress bar stays off


def test_audit_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    spark_log = tmp_path / "spark.log"
    missing = kvproxy(
        "audit", "--input", str(tmp_path / "nope"), "--output", out,
        "--spark-log-file", str(spark_log),
    )  # fmt: skip
    assert missing.returncode == 2
    assert not spark_log.exists()  # Spark did not start: no file, and no line naming one
    assert "Spark's own output" not in missing.stderr
    assert f"kvproxy audit: cannot read {tmp_path / 'nope'}: no such file" in missing.stderr

    nothing = kvproxy("audit", "--output", out)
    assert nothing.returncode == 2
    assert "nothing to audit" in nothing.stderr

    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults: {policies: [crc, {max_record_bytes: {limit: lots}}]}\n")
    config = kvproxy("audit", "-c", str(bad), "--input", str(TESTDATA_LOGS), "--output", out)
    assert config.returncode == 2
    assert "max_record_bytes" in config.stderr and "limit" in config.stderr

    no_java = kvproxy(
        "audit", "--input", str(TESTDATA_LOGS), "--output", out,
        "--spark-log-file", str(spark_log), env={"JAVA_HOME": "/nonexistent"},
    )  # fmt: skip
    assert no_java.returncode == 2
    assert not spark_log.exists()  # created for a JVM that never started, and removed
    assert "JAVA_HOME is /nonexistent but /nonexistent/bin/java does not exist" in no_java.stderr

    bad_time = kvproxy("audit", "--input", str(TESTDATA_LOGS), "--output", out, "--now", "soon")
    assert bad_time.returncode == 2
    assert "not a time: 'soon'" in bad_time.stderr
    assert not Path(out).exists()  # nothing was started, nothing written


def test_find_java_without_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SparkUnavailable, match="Java was not found"):
        find_java()
