"""A hostile file delivered by SIGHUP to `kvproxy serve`: read, parsed and refused on the reload
thread while the event loop keeps answering clients, with a short ERROR line, the rules in force
kept.

The file is padded with plain YAML ahead of its "billion laughs", so that reading it takes a while
(seconds): a client's request sent once the reload has started is answered before the refusal is
logged. A reload on the event loop answered it only after the whole file had been read.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

import yaml

from kvproxy.proxy.serve.reload import ConfigReloader
from kvproxy.settings.yaml_file import MAX_FILE_BYTES
from tests.harness import Broker
from tests.harness.produce import INVALID_RECORD
from tests.harness.proxy import run_proxy
from tests.harness.reload import (
    JSON_VALUE,
    NOT_JSON,
    connection,
    json_rule,
    kvproxy_serve,
    refused,
    reloaded,
    reloads_counted,
)
from tests.harness.yaml_bombs import bomb_lines

PADDING_ITEMS = 40_000
"""`- padding item` lines ahead of the bomb: about 600 KB of YAML, seconds of parsing."""
TOPIC_RULES = 2_000
"""Rules in a file that takes a while (a second or so) to read and build."""


def test_a_yaml_bomb_by_sighup_is_refused_while_other_clients_are_answered(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = make_topic(prefix="reload-bomb")
    with (
        kvproxy_serve(tmp_path, tansu, [json_rule(topic)], "--reload-interval", "0") as proxy,
        connection(proxy.port, topic) as conn,
    ):
        assert conn.produce(NOT_JSON) == INVALID_RECORD
        base = yaml.safe_dump({**proxy.base, "topics": [json_rule(topic)]})
        padding = "padding:\n" + "  - padding item\n" * PADDING_ITEMS
        proxy.write(base + padding + bomb_lines(9, "zz: [TOP]"))
        assert proxy.config.stat().st_size < MAX_FILE_BYTES

        seen = len(proxy.log_lines())
        proxy.proc.send_signal(signal.SIGHUP)
        reading = proxy.wait_for_log(lambda line: "config reload: reading" in line, seen)
        assert "INFO" in reading and f"{proxy.config} (SIGHUP)" in reading
        assert conn.produce(JSON_VALUE) == 0  # answered while the file is being read
        assert not any("config reload refused" in line for line in proxy.log_lines()[seen:])

        line = proxy.wait_for_log(
            refused("its aliases expand to more than 1,000,000 values"), seen, timeout=120
        )
        assert len(line) < 1000
        assert f"{proxy.config}: not valid YAML: line " in line
        assert ": its aliases expand to more than 1,000,000 values" in line
        assert conn.produce(NOT_JSON) == INVALID_RECORD  # the rules in force stay
        assert conn.produce(JSON_VALUE) == 0

        seen = len(proxy.log_lines())
        proxy.write(base + "#" * MAX_FILE_BYTES + "\n")
        proxy.proc.send_signal(signal.SIGHUP)
        line = proxy.wait_for_log(refused("too large"), seen)
        assert "the limit is 1,048,576 bytes" in line and len(line) < 1000
        assert conn.produce(NOT_JSON) == INVALID_RECORD

        seen = len(proxy.log_lines())
        proxy.write_config([])
        proxy.proc.send_signal(signal.SIGHUP)
        proxy.wait_for_log(reloaded, seen)
        assert conn.produce(NOT_JSON) == 0
        assert reloads_counted(proxy) == {"success": 1.0, "failure": 2.0}


def test_signals_during_a_reload_make_one_more_reload_not_one_each(
    tansu: Broker, tmp_path: Path
) -> None:
    """Five requests while a slow file is read: the one running, and one more that reads the file
    as it is when the first is done."""
    config = tmp_path / "kvproxy.yaml"
    results: list[str] = []
    with run_proxy(tansu.bootstrap) as proxy:
        base = proxy.config.model_dump(mode="json", include={"listen", "upstream"})
        rules = [
            {"match": f"topic-{n}", "default_policies": "drop", "policies": ["crc"]}
            for n in range(TOPIC_RULES)
        ]
        config.write_text(yaml.safe_dump({**base, "topics": rules}))
        reloader = ConfigReloader(proxy.server, config, poll_interval=0, on_result=results.append)

        async def five_signals() -> int:
            for _ in range(5):
                reloader.request_reload("SIGHUP")
                await asyncio.sleep(0)
            while reloader.busy:
                await asyncio.sleep(0.05)
            await reloader.stop()
            reloader.close()
            return sum(1 for _ in proxy.server.routing.rules)

        assert proxy.call(five_signals(), timeout=120) == TOPIC_RULES
    assert results == ["success", "success"]
