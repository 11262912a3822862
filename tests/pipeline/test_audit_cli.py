"""`kvproxy audit` as a user runs it: the command, its console output, its exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    summary = json.loads((out / "summary.json").read_text())
    assert summary["violations"] == 11
    assert summary["config"] == str(config)
    assert list((out / "violations").glob("*.parquet"))
    assert "<svg" in (out / "report.html").read_text()


def test_audit_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    missing = kvproxy("audit", "--input", str(tmp_path / "nope"), "--output", out)
    assert missing.returncode == 2
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
        "audit", "--input", str(TESTDATA_LOGS), "--output", out, env={"JAVA_HOME": "/nonexistent"}
    )
    assert no_java.returncode == 2
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
