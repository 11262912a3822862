"""`kvproxy quarantine replay` on the development config (`upstream: {embedded: true}`): the
embedded broker lives inside `kvproxy serve`, its data in memory. While serve runs, replay
writes to that broker (serve names it in the journal folder); when no serve runs, replay says
what to do instead of failing on a broker that is gone."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from kvproxy.journal import JournalReader
from kvproxy.protocol.messages import PRODUCE, decode_response
from tests.harness import RawKafkaClient, create_topic, unique_topic_name
from tests.harness.clients import consume_through
from tests.harness.processes import kvproxy_serve
from tests.harness.proxy import free_port_range
from tests.harness.requests import produce_request
from tests.harness.tansu import free_port

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]
KVPROXY = [sys.executable, "-m", "kvproxy.cli"]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def dev_config(path: Path, journal: Path, port: int, topic: str, *, json_only: bool) -> Path:
    """The README's development file, with a journal, ports of its own and (or not) a rule."""
    rules = (
        [{"match": topic, "default_policies": "drop", "policies": ["json"]}] if json_only else []
    )
    path.write_text(
        yaml.safe_dump(
            {
                "upstream": {"embedded": True},
                "listen": {"port": port, "broker_port_base": free_port_range(100)},
                "quarantine": {"dir": str(journal)},
                "topics": rules,
            }
        )
    )
    return path


def replay(config: Path, topic: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KVPROXY, "quarantine", "replay", "-c", str(config), "--topic", topic],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_replay_on_the_dev_config_writes_to_the_running_serves_broker(tmp_path: Path) -> None:
    topic = unique_topic_name("dev-replay")
    journal = tmp_path / "journal"
    port = free_port()
    strict = dev_config(tmp_path / "dev.yaml", journal, port, topic, json_only=True)
    relaxed = dev_config(tmp_path / "relaxed.yaml", journal, port, topic, json_only=False)
    log = tmp_path / "serve.log"
    with kvproxy_serve(strict, log, cwd=tmp_path) as proc:
        wait_for(lambda: "kvproxy ready" in log.read_text() or proc.poll() is not None, "ready")
        assert proc.poll() is None, log.read_text()
        bootstrap = f"{HOST}:{port}"
        create_topic(bootstrap, topic)
        with RawKafkaClient(HOST, port) as client:
            client.send_frame(produce_request(9, 1, topic, [(b"k", b"not json")]))
            body = decode_response(client.recv_frame(timeout=30), PRODUCE, 9).body
        ((answer,),) = [t.partition_responses for t in body.responses]
        assert answer.error_code != 0, answer
        wait_for(lambda: any(JournalReader(journal).entries()), "the journal entry")

        done = replay(relaxed, topic)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert "1 replayed (1 record), 0 still failing" in done.stdout, done.stdout
        assert consume_through(bootstrap, topic, 1) == [b"not json"]

    gone = replay(relaxed, topic)
    assert gone.returncode != 0
    assert "the embedded broker runs inside `kvproxy serve`" in gone.stderr, gone.stderr
    assert "kvproxy serve -c FILE" in gone.stderr, gone.stderr
