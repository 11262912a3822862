"""`kvproxy serve --log-format json`: every stderr line is a JSON object, and a rejection is one
line carrying its fields (topic, partition, policy, code, message, client id and address)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness import Broker
from tests.harness.processes import HOST, REPO
from tests.harness.produce import CLIENT_ID, INVALID_RECORD, JSON_ONLY, batch, produce
from tests.harness.reload import kvproxy_serve


def json_lines(text: str) -> list[dict[str, Any]]:
    entries = []
    for line in text.splitlines():
        entry = json.loads(line)  # every line, not only the rejections
        assert isinstance(entry, dict), line
        assert {"time", "level", "logger", "message"} <= entry.keys(), line
        entries.append(entry)
    return entries


def test_json_log_lines_parse_and_carry_the_rejection_fields(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = make_topic(prefix="logs-json")
    with kvproxy_serve(
        tmp_path, tansu, [{"match": topic, **JSON_ONLY}], "--log-format", "json"
    ) as proxy:
        answer = produce(HOST, proxy.port, 9, [(topic, 0, batch(b"not json"))])
        assert answer[(topic, 0)].error_code == INVALID_RECORD
        seen = len(proxy.log_lines())
        proxy.proc.send_signal(signal.SIGHUP)  # a reload is logged as JSON too
        proxy.wait_for_log(lambda line: "config reloaded" in line, seen)
    entries = json_lines(proxy.stderr.read_text())
    rejections = [e for e in entries if e.get("event") == "rejection"]
    assert len(rejections) == 1, entries
    [rejection] = rejections
    assert rejection["level"] == "WARNING"
    assert rejection["logger"] == "kvproxy.rejections"
    assert rejection["time"].endswith("Z")
    assert {k: rejection[k] for k in ("topic", "partition", "policy", "code", "error")} == {
        "topic": topic,
        "partition": 0,
        "policy": "json",
        "code": INVALID_RECORD,
        "error": "INVALID_RECORD",
    }
    assert "not valid JSON" in rejection["error_message"]
    assert rejection["client_id"] == CLIENT_ID
    host, port = rejection["client_address"].rsplit(":", 1)
    assert host == HOST and int(port) > 0
    assert rejection["enforced"] is True
    [reload] = [e for e in entries if e.get("event") == "config_reload"]
    assert (reload["level"], reload["result"], reload["trigger"]) == ("INFO", "success", "SIGHUP")


def test_json_log_format_reports_a_bad_config_as_json(tmp_path: Path) -> None:
    config = tmp_path / "kvproxy.yaml"
    config.write_text("upstream: {bootstrap_servers: ['127.0.0.1:1']}\nlisten: {prot: 1}\n")
    done = subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "serve", "-c", str(config), "--log-format", "json"],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    [entry] = json_lines(done.stderr)
    assert entry["level"] == "ERROR"
    assert "listen.prot: unknown key" in entry["message"]
    assert entry["exit_code"] == 2
