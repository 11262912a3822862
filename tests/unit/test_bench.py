"""The benchmark suite still runs: `make bench`'s driver on the engine benchmark, smoke-sized.

The network benchmarks need a broker and minutes; the engine one runs in seconds and exercises
the same public calls the proxy makes per request (parse_records, the chains, decode_request,
ProduceEngine.decide), so an API change that would break `make bench` fails here first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_run_all_quick_engine_writes_its_figures(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "bench/run_all.py", "--quick", "--only", "engine"],
        cwd=ROOT,
        env={**os.environ, "KVPROXY_BENCH_RESULTS": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1/1 ran" in result.stdout
    figures = json.loads((tmp_path / "engine.json").read_text())
    assert figures["benchmark"] == "engine"
    assert figures["machine"]["cpus"] >= 1
    report = (tmp_path / "latest.md").read_text()
    assert "## 4. Validation engine alone" in report
    assert "record-level checks" in report
