"""`kvproxy dump ... | head`: the reader that leaves early closes the pipe; that ends the output,
it says nothing about the segment, which must not be reported as a bad batch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.harness.records_testdata import KAFKA_LOGS

REPO = Path(__file__).resolve().parents[2]
SEGMENT = KAFKA_LOGS / "air_quality_data-1" / "00000000000000000000.log"


def test_dump_into_head_ends_quietly_with_status_0() -> None:
    whole = subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "dump", "--records", str(SEGMENT)],
        cwd=REPO,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert whole.returncode == 0, whole.stderr
    # More than a pipe holds (64 KiB) plus what head reads before leaving: the writer meets the
    # closed pipe before it is done.
    assert len(whole.stdout) > 65536 + 16384
    done = subprocess.run(
        [
            "bash",
            "-c",
            'set -o pipefail; "$0" -m kvproxy.cli dump --records "$1" | head -n 1',
            sys.executable,
            str(SEGMENT),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout == f"Dumping {SEGMENT}\n"
    assert done.stderr == ""
    assert done.returncode == 0
