"""`kvproxy serve -c FILE` whose file a test rewrites, one raw connection kept open across reloads,
and what the proxy logs and counts for a reload."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from kvproxy.protocol.messages import PRODUCE, decode_response
from kvproxy.proxy.serve.reload import ConfigReloader
from tests.harness import Broker
from tests.harness.processes import HOST, REPO, wait_for_answer
from tests.harness.produce import JSON_ONLY, batch, partitions_of, produce_frame
from tests.harness.proxy import free_port_range
from tests.harness.raw_client import RawKafkaClient
from tests.harness.tansu import free_port

NOT_JSON = b"plain text"
JSON_VALUE = b'{"id": 1}'


class Proxy:
    """`kvproxy serve -c FILE` with its stderr in a file, and the config it was started with."""

    def __init__(
        self, config: Path, stderr: Path, proc: subprocess.Popen[bytes], base: dict[str, Any]
    ):
        self.config = config
        self.stderr = stderr
        self.proc = proc
        self.base = base
        self.port = int(base["listen"]["port"])

    def write(self, text: str) -> None:
        """Replace the file the way an editor or a config management tool does (rename)."""
        tmp = self.config.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.config)

    def write_config(self, topics: list[dict[str, Any]], **sections: Any) -> None:
        self.write(yaml.safe_dump({**self.base, **sections, "topics": topics}))

    def log_lines(self) -> list[str]:
        return self.stderr.read_text(errors="replace").splitlines()

    def wait_for_log(
        self, predicate: Callable[[str], bool], after: int, timeout: float = 15
    ) -> str:
        """The first line past the first `after` lines that satisfies `predicate`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"kvproxy exited: {self.log_lines()}"
            for line in self.log_lines()[after:]:
                if predicate(line):
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no such log line after line {after}: {self.log_lines()[after:]}")


@contextlib.contextmanager
def kvproxy_serve(
    tmp_path: Path, tansu: Broker, topics: list[dict[str, Any]], *extra_args: str
) -> Iterator[Proxy]:
    base = {
        "listen": {
            "host": HOST,
            "port": free_port(),
            "broker_port_base": free_port_range(20),
            "lowest_node_id": 100,  # Tansu is node 111
            "max_brokers": 20,
        },
        "upstream": {"bootstrap_servers": [tansu.bootstrap]},
        "shutdown": {"drain_timeout_ms": 2000},
        "metrics": {"host": HOST, "port": free_port()},
    }
    config = tmp_path / "kvproxy.yaml"
    config.write_text(yaml.safe_dump({**base, "topics": topics}))
    stderr = tmp_path / "stderr.log"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvproxy.cli", "serve", "-c", str(config), *extra_args],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            proxy = Proxy(config, stderr, proc, base)
            wait_for_answer(proxy.port, proc)
            yield proxy
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0, proxy.log_lines()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


class Connection:
    """One raw client connection kept open for the whole test."""

    def __init__(self, client: RawKafkaClient, topic: str) -> None:
        self.client = client
        self.topic = topic
        self.correlation_id = 100

    def produce(self, value: bytes) -> int:
        """Send one Produce v9 of `value` to partition 0; the partition's error code."""
        self.correlation_id += 1
        answer = self.client.request(
            produce_frame(9, self.correlation_id, [(self.topic, 0, batch(value))]), timeout=15
        )
        body = decode_response(answer, PRODUCE, 9).body
        assert int(body.responses[0].partition_responses[0].index) == 0
        return int(partitions_of(body)[(self.topic, 0)].error_code)


@contextlib.contextmanager
def connection(port: int, topic: str) -> Iterator[Connection]:
    with RawKafkaClient(HOST, port) as client:
        yield Connection(client, topic)


def reloads_counted(proxy: Proxy) -> dict[str, float]:
    """kvproxy_config_reloads_total by result, from the proxy's /metrics."""
    metrics = proxy.base["metrics"]
    url = f"http://{metrics['host']}:{metrics['port']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    counted = {}
    for line in text.splitlines():
        match = re.fullmatch(r'kvproxy_config_reloads_total\{result="(\w+)"\} (\S+)', line)
        if match:
            counted[match.group(1)] = float(match.group(2))
    return counted


def reloaded(line: str) -> bool:
    return "config reloaded:" in line


def refused(problem: str) -> Callable[[str], bool]:
    return lambda line: "ERROR" in line and "config reload refused:" in line and problem in line


def json_rule(topic: str) -> dict[str, Any]:
    return {"match": topic, **JSON_ONLY}


async def reload_once(reloader: ConfigReloader) -> bool:
    """One reload as a SIGHUP makes it, awaited; the reload thread is stopped after it."""
    try:
        return await reloader.reload_off_loop()
    finally:
        await reloader.stop()
