"""Hot reload through `kvproxy serve`: SIGHUP and a change of the file swap the policy rules for
the next request on a connection that stays open; a bad file is refused and the old rules stay.

Every check is a real Produce v9 request on one raw connection, with Tansu as the upstream.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from kvproxy.proxy.serve.reload import ConfigReloader
from tests.harness import Broker
from tests.harness.produce import INVALID_RECORD, stored
from tests.harness.proxy import run_proxy
from tests.harness.reload import (
    JSON_VALUE,
    NOT_JSON,
    connection,
    json_rule,
    kvproxy_serve,
    refused,
    reload_once,
    reloaded,
    reloads_counted,
)


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
            return await reload_once(reloader)

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
            assert await reload_once(reloader)
            return reloader

        proxy.call(reload())
        assert closed == []
        time.sleep(grace + 0.3)
        assert closed == [True]


def test_a_change_made_while_the_proxy_starts_is_reloaded(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """`serve` reads the file, then opens its listeners, then starts watching the file: a change
    written in between is the file's state when watching starts, and must still be applied. The
    watch compares with the file as it was read (`loaded`), not as it is when watching starts."""
    from kvproxy.proxy.serve.reload import file_signature

    topic = make_topic(prefix="reload-early")
    config = tmp_path / "kvproxy.yaml"
    with run_proxy(tansu.bootstrap) as proxy:
        base = proxy.config.model_dump(mode="json", include={"listen", "upstream"})
        config.write_text(yaml.safe_dump(base))  # what the proxy serves: no rule for the topic
        loaded = file_signature(config)
        config.write_text(yaml.safe_dump({**base, "topics": [json_rule(topic)]}))  # meanwhile

        async def first_check() -> bool | None:
            reloader = ConfigReloader(
                proxy.server, config, poll_interval=0, retire_grace=0, loaded=loaded
            )
            try:
                return await reloader.check_file()
            finally:
                await reloader.stop()

        assert proxy.call(first_check()) is True
        with connection(proxy.port, topic) as conn:
            assert conn.produce(NOT_JSON) == INVALID_RECORD
    assert stored(tansu, topic) == []
