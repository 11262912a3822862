"""`kvproxy dump` reads a segment one batch at a time: its memory does not grow with the file."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kvproxy.protocol.records import build_batch

REPO = Path(__file__).resolve().parents[2]
SEGMENT_MIB = 300
RSS_LIMIT_MIB = 150

# Runs the dump as its own child, so that the peak RSS read is the dump's and no other test's.
MEASURE = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True, check=False)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(done.returncode, peak)
print(done.stdout, end="")
sys.stderr.write(done.stderr)
"""


def write_large_segment(path: Path, mebibytes: int) -> tuple[int, int]:
    """About `mebibytes` of 1 MiB batches with consecutive offsets; (batches, records)."""
    records_per_batch = 1024
    batch = build_batch([(b"k", bytes(1000), None, 1)] * records_per_batch)
    batches = mebibytes * 1024 * 1024 // len(batch)
    with path.open("wb") as out:
        for index in range(batches):
            out.write(struct.pack(">q", index * records_per_batch))  # outside the CRC
            out.write(batch[8:])
    return batches, batches * records_per_batch


@pytest.mark.parametrize("options", [[], ["--headers-only"]])
def test_json_memory_bounded_on_a_large_segment(tmp_path: Path, options: list[str]) -> None:
    segment = tmp_path / "big-0" / "00000000000000000000.log"
    segment.parent.mkdir()
    batches, records = write_large_segment(segment, SEGMENT_MIB)
    command = [sys.executable, "-m", "kvproxy.cli", "dump", "--json", *options, str(segment)]
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, *command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    first_line, _, output = done.stdout.partition("\n")
    code, peak_kib = map(int, first_line.split())
    result = json.loads(output)
    assert code == 0, done.stderr
    assert (result["batches"], result["records"]) == (batches, records)
    assert result["errors"] == []
    assert peak_kib < RSS_LIMIT_MIB * 1024, f"peak RSS {peak_kib // 1024} MiB"
