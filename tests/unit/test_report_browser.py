"""report.html in a real browser (headless Chromium) at 1280 px: no word of a table cell is
broken across lines, no cell lies beyond what the page can show, and every violation is either
a bar of the timeline or counted in its "no record timestamp" note. A line may end at a space,
after a `/` (paths) or after a `-` (as browsers break `orders-0`), never inside a word."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvproxy.pipeline.report import render_report
from tests.harness.browser import run_in_page, screenshot

REPO = Path(__file__).resolve().parents[2]
WIDTH, HEIGHT = 1280, 900
HOUR_MS = 3_600_000
T0 = 1_700_000_000_000

CHECKS = """
const result = {broken: [], clipped: [], timeline: 0, untimed: 0};
for (const cell of document.querySelectorAll('td, th')) {
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const word of node.data.matchAll(/[^\\s\\/-]+/g)) {  // a line may end at a space, / or -
      const range = document.createRange();
      range.setStart(node, word.index);
      range.setEnd(node, word.index + word[0].length);
      const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
      if (lines.size > 1) result.broken.push(word[0]);
    }
  }
}
const viewport = document.documentElement.clientWidth;
for (const table of document.querySelectorAll('table')) {
  let box = table.parentElement;
  while (box && !['auto', 'scroll'].includes(getComputedStyle(box).overflowX)) {
    box = box.parentElement;
  }
  const limit = box ? box.getBoundingClientRect().left + box.scrollWidth : viewport;
  for (const cell of table.querySelectorAll('td, th')) {
    if (cell.getBoundingClientRect().right > limit + 1) result.clipped.push(cell.textContent);
  }
}
result.timeline = [...document.querySelectorAll('rect[data-count]')]
  .reduce((sum, rect) => sum + Number(rect.dataset.count), 0);
result.untimed = [...document.querySelectorAll('[data-untimed]')]
  .reduce((sum, note) => sum + Number(note.dataset.untimed), 0);
result.scrollWidth = document.documentElement.scrollWidth;
window.result = result;
"""

LONG_TOPIC = "TestTopicPatientRecordsFromTheNorthernRegionWithAVeryLongName"
SOURCE = "/var/lib/kafka/data/" + LONG_TOPIC + "-0/00000000000000000000.log"


def hostile_summary() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Long names in every column, violations with and without a timestamp."""
    buckets = [
        {"start_ms": T0 + i * 60_000, "counts": {"timestamps": 2, "compacted_key": 1}}
        for i in range(60)
    ]
    timed = 3 * len(buckets)
    untimed = 7
    summary = {
        "title": "kvproxy audit",
        "started": "2026-11-23T20:00:00Z",
        "finished": "2026-11-23T20:01:00Z",
        "duration_s": 60.0,
        "inputs": [SOURCE],
        "config": "kvproxy.yaml",
        "sample": None,
        "now_ms": T0 + 2 * HOUR_MS,
        "records_scanned": 5000,
        "batches_scanned": 400,
        "data_batches": 400,
        "bytes_scanned": 1_000_000,
        "control_batches": 1,
        "violations": timed + untimed,
        "violations_by_mode": {"enforce": timed + untimed, "warn": 0},
        "violations_by_policy": {"timestamps": 120, "compacted_key": 60, "crc": untimed},
        "violations_by_topic": {LONG_TOPIC: timed + untimed},
        "violations_by_code": {
            "INVALID_TIMESTAMP": {"code": 32, "count": 120},
            "INVALID_RECORD": {"code": 87, "count": 60},
            "CORRUPT_MESSAGE": {"code": 2, "count": untimed},
        },
        "partitions": {
            f"{LONG_TOPIC}-0": {
                "topic": LONG_TOPIC,
                "partition": 0,
                "records": 5000,
                "batches": 400,
                "data_batches": 400,
                "control_batches": 1,
                "violations": timed + untimed,
                "mode": "enforce",
                "policies": ["batch_integrity", "crc", "timestamps", "compacted_key"],
                "compacted": True,
            }
        },
        "time_range": {"first_ms": T0, "last_ms": T0 + HOUR_MS},
        "timeline": {"bucket_ms": 60_000, "buckets": buckets, "untimed": untimed},
        "errors": [],
    }
    samples = [
        {
            "topic": LONG_TOPIC,
            "partition": 0,
            "offset": None if i % 2 else 1000 + i,
            "timestamp": None if i % 2 else T0 + i,
            "key_preview": "customer-" + "x" * 40,
            "value_size": 100,
            "policy": "compacted_key" if i % 2 == 0 else "crc",
            "error_code": 87 if i % 2 == 0 else 2,
            "error_name": "INVALID_RECORD" if i % 2 == 0 else "CORRUPT_MESSAGE",
            "message": "Compacted topic cannot accept message without key in topic partition "
            f"{LONG_TOPIC}-0",
            "source": SOURCE,
            "position": 4096 * i,
        }
        for i in range(20)
    ]
    return summary, samples


def _pages(tmp_path: Path) -> list[tuple[Path, int]]:
    """(page, violations it reports): the sample report of a real audit, and a hostile one."""
    summary, samples = hostile_summary()
    hostile = tmp_path / "hostile.html"
    hostile.write_text(render_report(summary, samples), encoding="utf-8")
    example = REPO / "examples" / "audit" / "report.html"
    example_total = json.loads((example.parent / "summary.json").read_text())["violations"]
    copy = tmp_path / "example.html"
    copy.write_text(example.read_text(encoding="utf-8"), encoding="utf-8")
    return [(copy, int(example_total)), (hostile, int(summary["violations"]))]


@pytest.mark.parametrize("which", [0, 1], ids=["example-audit", "hostile-names"])
def test_the_report_reads_whole_at_1280_px(tmp_path: Path, which: int) -> None:
    page, violations = _pages(tmp_path)[which]
    found = run_in_page(page, CHECKS, WIDTH, HEIGHT)
    assert found["broken"] == [], "words broken across lines"
    assert found["clipped"] == [], "cells beyond what the page shows"
    assert found["scrollWidth"] <= WIDTH, "the page scrolls sideways"
    assert found["timeline"] + found["untimed"] == violations

    png = tmp_path / "report.png"
    screenshot(page, png, WIDTH, HEIGHT)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
