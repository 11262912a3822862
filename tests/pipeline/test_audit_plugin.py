"""The audit uses a policy of another distribution (examples/policy-plugin) by its name, on the
executors too (they are handed the driver's entry points)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kvproxy.protocol.records import build_batch
from tests.harness.audit import audit, write_config
from tests.harness.policy_plugin import POLICY, install_example_plugin
from tests.harness.segments import assign_offsets, write_segment


def test_the_plugin_policy_by_name_yields_its_violations(spark: Any, tmp_path: Path) -> None:
    install_example_plugin()
    now_ms = int(time.time() * 1000)
    parts = assign_offsets(
        [
            build_batch([(b"k", b"fine", None, now_ms), (b"k", b"spam!", None, now_ms)]),
            build_batch([(b"k", b"also fine", None, now_ms)]),
            build_batch([(b"k", b"more spam", None, now_ms)]),
        ]
    )
    write_segment(tmp_path / "logs", "chat", 0, parts)
    config = write_config(
        tmp_path,
        "topics:\n  - {match: chat, default_policies: drop, "
        f"policies: [{{{POLICY}: {{word: spam}}}}]}}\n",
    )

    summary, rows = audit(
        spark, tmp_path, inputs=(str(tmp_path / "logs"),), config=config, now_ms=now_ms
    )

    found = sorted((r["policy"], r["error_code"], r["offset"], r["message"]) for r in rows)
    assert found == [
        (POLICY, 44, 1, "value contains 'spam'"),
        (POLICY, 44, 3, "value contains 'spam'"),
    ]
    assert summary["violations_by_policy"] == {POLICY: 2}
    assert summary["violations_by_code"] == {"POLICY_VIOLATION": {"code": 44, "count": 2}}
