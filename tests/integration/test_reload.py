"""Hot reload through `kvproxy serve`: SIGHUP and a change of the file swap the policy rules for
the next request on a connection that stays open; a bad file is refused and the old rules stay.

Every check is a real Produce v9 request on one raw connection, with Tansu as the upstream.
"""

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

from protocol.messages import PRODUCE, decode_response
from proxy.reload import ConfigReloader
from tests.harness import Broker
from tests.harness.proxy import free_port_range, run_proxy
from tests.harness.raw_client import RawKafkaClient
from tests.harness.tansu import free_port
from tests.integration.test_policies_answers import (
    INVALID_RECORD,
    JSON_ONLY,
    batch,
    partitions_of,
    produce_frame,
    stored,
)
from tests.integration.test_proxy_lifecycle import REPO, wait_for_answer

HOST = "127.0.0.1"
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


def test_sighup_applies_the_new_rules_to_the_next_request_on_the_same_connection(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = make_topic(prefix="reload-hup")
    with (
        kvproxy_serve(tmp_path, tansu, [], "--reload-interval", "0") as proxy,
        connection(proxy.port, topic) as conn,
    ):
        assert conn.produce(NOT_JSON) == 0

        proxy.write_config([json_rule(topic)])
        time.sleep(0.3)  # file watching is off: only the signal reloads
        assert conn.produce(NOT_JSON) == 0
        seen = len(proxy.log_lines())
        proxy.proc.send_signal(signal.SIGHUP)
        line = proxy.wait_for_log(reloaded, seen)
        assert "INFO" in line and "1 topic rule" in line

        assert conn.produce(NOT_JSON) == INVALID_RECORD  # same connection, new rules
        assert conn.produce(JSON_VALUE) == 0
        assert reloads_counted(proxy) == {"success": 1.0}
    assert stored(tansu, topic) == [NOT_JSON, NOT_JSON, JSON_VALUE]


def test_a_file_change_reloads_and_bad_files_are_refused_with_the_old_rules_kept(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = make_topic(prefix="reload-watch")
    with (
        kvproxy_serve(tmp_path, tansu, [], "--reload-interval", "0.1") as proxy,
        connection(proxy.port, topic) as conn,
    ):
        assert conn.produce(NOT_JSON) == 0

        seen = len(proxy.log_lines())
        proxy.write_config([json_rule(topic)])
        proxy.wait_for_log(reloaded, seen)
        assert conn.produce(NOT_JSON) == INVALID_RECORD
        assert conn.produce(JSON_VALUE) == 0

        # Each bad file would drop the json rule if it were applied even in part.
        bad_files = {
            "not valid YAML": yaml.safe_dump({**proxy.base, "topics": []}) + "topics: [oops\n",
            "topics[0].polices: unknown key": yaml.safe_dump(
                {**proxy.base, "topics": [{"match": topic, "polices": ["crc"]}]}
            ),
            "limts: unknown key": yaml.safe_dump(
                {**proxy.base, "topics": [], "limts": {"max_frame_bytes": 2048}}
            ),
            "cannot import no_such_module": yaml.safe_dump(
                {
                    **proxy.base,
                    "topics": [
                        {
                            "match": topic,
                            "policies": [{"custom": {"class": "no_such_module:Policy"}}],
                        }
                    ],
                }
            ),
        }
        for problem, text in bad_files.items():
            seen = len(proxy.log_lines())
            proxy.write(text)
            line = proxy.wait_for_log(refused(problem), seen)
            assert "kvproxy.yaml:" in line
            assert "(keeping the rules in force)" in line
            assert not any(reloaded(later) for later in proxy.log_lines()[seen:])
            assert conn.produce(NOT_JSON) == INVALID_RECORD, problem
            assert conn.produce(JSON_VALUE) == 0, problem

        # A good file again: accepted, and a change that needs a restart is named, not applied.
        seen = len(proxy.log_lines())
        proxy.write_config([], limits={"max_in_flight_requests": 7})
        warning = proxy.wait_for_log(lambda line: "need" in line and "restart" in line, seen)
        assert "WARNING" in warning and "limits" in warning
        proxy.wait_for_log(reloaded, seen)
        assert conn.produce(NOT_JSON) == 0
        assert reloads_counted(proxy) == {"success": 2.0, "failure": float(len(bad_files))}
    assert stored(tansu, topic) == [NOT_JSON, JSON_VALUE, *[JSON_VALUE] * len(bad_files), NOT_JSON]


def test_reload_keeps_the_producer_state_and_closes_the_replaced_rules(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = make_topic(prefix="reload-inproc")
    config = tmp_path / "kvproxy.yaml"
    results: list[str] = []
    with run_proxy(tansu.bootstrap) as proxy:
        base = proxy.config.model_dump(mode="json", include={"listen", "upstream"})
        first = proxy.server.routing
        closed: list[bool] = []
        original_close = first.close

        def close() -> None:
            closed.append(True)
            original_close()

        first.close = close  # type: ignore[method-assign]

        async def reload(text: str) -> bool:
            config.write_text(text)
            reloader = ConfigReloader(
                proxy.server, config, poll_interval=0, on_result=results.append, retire_grace=0
            )
            return reloader.reload()

        assert proxy.call(reload(yaml.safe_dump({**base, "topics": [json_rule(topic)]})))
        assert proxy.server.routing is not first
        assert proxy.server.routing.producer_state is first.producer_state
        assert closed == [True]
        assert not proxy.call(reload("upstream: [\n"))
        with connection(proxy.port, topic) as conn:
            assert conn.produce(NOT_JSON) == INVALID_RECORD
    assert results == ["success", "failure"]


def test_replaced_rules_stay_open_for_the_grace_period(tansu: Broker, tmp_path: Path) -> None:
    grace = 0.2
    config = tmp_path / "kvproxy.yaml"
    with run_proxy(tansu.bootstrap) as proxy:
        base = proxy.config.model_dump(mode="json", include={"listen", "upstream"})
        first = proxy.server.routing
        closed: list[bool] = []
        original_close = first.close

        def close() -> None:
            closed.append(True)
            original_close()

        first.close = close  # type: ignore[method-assign]
        config.write_text(yaml.safe_dump(base))

        async def reload() -> ConfigReloader:
            reloader = ConfigReloader(proxy.server, config, poll_interval=0, retire_grace=grace)
            assert reloader.reload()
            return reloader

        proxy.call(reload())
        assert closed == []
        time.sleep(grace + 0.3)
        assert closed == [True]
