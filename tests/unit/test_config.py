"""kvproxy.proxy.config.proxy_config: defaults, and an error message that names the key for every
bad value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvproxy.protocol.framing import DEFAULT_MAX_FRAME_SIZE
from kvproxy.proxy.config.proxy_config import load_config, parse_config
from kvproxy.settings.addresses import parse_host_port
from kvproxy.settings.loading import ConfigError

UPSTREAM = {"bootstrap_servers": ["kafka:9092"]}


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "test.yaml")
    return str(caught.value)


def test_defaults() -> None:
    config = parse_config({"upstream": UPSTREAM})
    listen = config.listen
    assert (listen.host, listen.port, listen.advertised_host) == ("127.0.0.1", 9192, None)
    assert listen.public_host == "127.0.0.1"
    assert (listen.broker_port_base, listen.lowest_node_id, listen.max_brokers) == (9193, None, 100)
    assert listen.tls is None
    assert config.upstream.bootstrap_servers == ("kafka:9092",)
    assert config.upstream.embedded is False
    assert config.upstream.connect_timeout_ms == 10_000
    assert config.upstream.tls is None
    assert config.limits.max_frame_bytes == DEFAULT_MAX_FRAME_SIZE == 100 * 1024 * 1024
    assert config.limits.max_in_flight_requests == 100
    assert config.limits.write_buffer_high_bytes == 4 * 1024 * 1024
    assert config.shutdown.drain_timeout_ms == 10_000


def test_advertised_host_is_what_clients_are_told() -> None:
    config = parse_config(
        {"listen": {"host": "0.0.0.0", "advertised_host": "proxy.example"}, "upstream": UPSTREAM}
    )
    assert config.listen.public_host == "proxy.example"


def test_bootstrap_servers_as_a_comma_separated_string() -> None:
    config = parse_config({"upstream": {"bootstrap_servers": "a:1, b:2 ,[::1]:3"}})
    assert config.upstream.bootstrap_servers == ("a:1", "b:2", "[::1]:3")
    assert config.upstream.addresses() == (("a", 1), ("b", 2), ("::1", 3))


def test_embedded_upstream() -> None:
    config = parse_config({"upstream": {"embedded": True}})
    assert config.upstream.embedded
    assert config.upstream.addresses() == ()


def test_config_is_frozen() -> None:
    config = parse_config({"upstream": UPSTREAM})
    with pytest.raises(ValueError):
        config.listen.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        ("kafka:9092", ("kafka", 9092)),
        ("10.0.0.1:1", ("10.0.0.1", 1)),
        ("[::1]:9092", ("::1", 9092)),
        ("kafka:65535", ("kafka", 65535)),
    ],
)
def test_parse_host_port(server: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(server) == expected


@pytest.mark.parametrize("server", ["kafka", "kafka:", ":9092", "kafka:0", "kafka:65536", "k:x1"])
def test_parse_host_port_rejects(server: str) -> None:
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        parse_host_port(server)


# ---- every validation error names where and why ----


@pytest.mark.parametrize(
    ("data", "where", "why"),
    [
        ({"upstream": UPSTREAM, "lissen": {}}, "lissen", "unknown key"),
        ({"upstream": UPSTREAM, "listen": {"prot": 1}}, "listen.prot", "unknown key"),
        ({"upstream": {**UPSTREAM, "tls": {"ca": "x"}}}, "upstream.tls.ca", "unknown key"),
        (
            {"upstream": UPSTREAM, "errors": {"profile": "kop"}},
            "errors.profile",
            "must be kafka or kip, not",
        ),
        (
            {"upstream": UPSTREAM, "errors": {"legacy_below": 14}},
            "errors.legacy_below",
            "at most 13",
        ),
        (
            {"upstream": UPSTREAM, "reject": "topic"},
            "reject",
            "must be partition or request, not 'topic'",
        ),
        ({"upstream": UPSTREAM, "quarantine": {"path": "q"}}, "quarantine.path", "unknown key"),
        (
            {"upstream": UPSTREAM, "quarantine": {"dead_letter_suffix": ""}},
            "quarantine.dead_letter_suffix",
            "empty",
        ),
        ({"upstream": UPSTREAM, "audit": {}}, "audit", "unknown key"),
        (
            {"upstream": UPSTREAM, "listen": {"port": 70000}},
            "listen.port",
            "at most 65535, not 70000",
        ),
        ({"upstream": UPSTREAM, "listen": {"port": -1}}, "listen.port", "at least 0, not -1"),
        (
            {"upstream": UPSTREAM, "listen": {"port": "abc"}},
            "listen.port",
            "a whole number, not 'abc'",
        ),
        (
            {"upstream": UPSTREAM, "listen": {"max_brokers": 0}},
            "listen.max_brokers",
            "must be at least",
        ),
        (
            {"upstream": UPSTREAM, "listen": {"lowest_node_id": -1}},
            "listen.lowest_node_id",
            "must be at least",
        ),
        (
            {"upstream": UPSTREAM, "listen": {"broker_port_base": 65500, "max_brokers": 100}},
            "listen",
            "runs past port 65535",
        ),
        (
            {"upstream": UPSTREAM, "listen": {"port": 9200, "broker_port_base": 9193}},
            "listen",
            "port 9200 falls inside the broker port range starting at 9193",
        ),
        ({"upstream": {"bootstrap_servers": ["kafka"]}}, "upstream.bootstrap_servers", "HOST:PORT"),
        (
            {"upstream": {"bootstrap_servers": "a:1,b:99999"}},
            "upstream.bootstrap_servers",
            "'b:99999' is not HOST:PORT",
        ),
        (
            {"upstream": {"bootstrap_servers": ["a:1"], "embedded": True}},
            "upstream",
            "set either bootstrap_servers or embedded: true, not both",
        ),
        ({"upstream": {}}, "upstream", "bootstrap_servers is required"),
        (
            {"upstream": {**UPSTREAM, "connect_timeout_ms": 0}},
            "upstream.connect_timeout_ms",
            "must be at least",
        ),
        (
            {"upstream": UPSTREAM, "limits": {"max_frame_bytes": 10}},
            "limits.max_frame_bytes",
            "1024",
        ),
        (
            {"upstream": UPSTREAM, "limits": {"max_in_flight_requests": 0}},
            "limits.max_in_flight_requests",
            "must be at least",
        ),
        (
            {"upstream": UPSTREAM, "limits": {"write_buffer_high_bytes": 1}},
            "limits.write_buffer_high_bytes",
            "1024",
        ),
        (
            {"upstream": UPSTREAM, "shutdown": {"drain_timeout_ms": -5}},
            "shutdown.drain_timeout_ms",
            "must be at least",
        ),
    ],
)
def test_validation_errors_name_the_key(data: dict[str, Any], where: str, why: str) -> None:
    message = error_of(data)
    lines = message.splitlines()
    assert lines[0].startswith("test.yaml: ") and "problem(s)" in lines[0]
    assert any(line.strip().startswith(f"{where}:") and why in line for line in lines[1:]), message


def test_a_missing_key_is_named_in_the_section_that_lacks_it() -> None:
    assert error_of({}) == "test.yaml: 1 problem(s)\n  upstream is missing"
    assert error_of({"upstream": UPSTREAM, "listen": {"tls": {"cert_file": "c"}}}) == (
        "test.yaml: 1 problem(s)\n  listen.tls: key_file is missing"
    )


def test_a_section_of_the_wrong_type_says_what_it_must_be() -> None:
    assert error_of({"upstream": UPSTREAM, "listen": 5, "topics": "orders"}) == (
        "test.yaml: 2 problem(s)\n"
        "  listen must be a mapping, not a number\n"
        "  topics must be a list, not a string"
    )


def test_an_empty_topics_section_is_no_topics() -> None:
    assert parse_config({"upstream": UPSTREAM, "topics": None, "defaults": None}).topics == ()


def test_several_problems_are_all_reported() -> None:
    message = error_of({"upstream": {"bootstrap_servers": ["x"]}, "listen": {"port": -1, "bad": 1}})
    assert message.splitlines()[0] == "test.yaml: 3 problem(s)"
    assert "listen.port" in message and "listen.bad: unknown key" in message
    assert "upstream.bootstrap_servers" in message


def test_listener_tls() -> None:
    config = parse_config(
        {
            "listen": {"tls": {"cert_file": "/c.pem", "key_file": "/k.pem", "key_password": "pw"}},
            "upstream": UPSTREAM,
        }
    )
    tls = config.listen.tls
    assert tls is not None
    assert tls.key_password is not None and tls.key_password.get_secret_value() == "pw"
    assert (tls.cert_file, tls.key_file, tls.client_ca_file) == (
        Path("/c.pem"),
        Path("/k.pem"),
        None,
    )
    mutual = parse_config(
        {
            "listen": {"tls": {"cert_file": "c", "key_file": "k", "client_ca_file": "ca.pem"}},
            "upstream": UPSTREAM,
        }
    )
    assert mutual.listen.tls is not None and mutual.listen.tls.client_ca_file == Path("ca.pem")


def test_upstream_tls_defaults_and_values() -> None:
    config = parse_config({"upstream": {**UPSTREAM, "tls": {}}})
    tls = config.upstream.tls
    assert tls is not None
    assert (tls.ca_file, tls.cert_file, tls.key_file, tls.check_hostname) == (
        None,
        None,
        None,
        True,
    )
    config = parse_config(
        {
            "upstream": {
                **UPSTREAM,
                "tls": {
                    "ca_file": "ca.pem",
                    "cert_file": "c.pem",
                    "key_file": "k.pem",
                    "check_hostname": False,
                },
            }
        }
    )
    tls = config.upstream.tls
    assert tls is not None
    assert (tls.ca_file, tls.cert_file, tls.key_file, tls.check_hostname) == (
        Path("ca.pem"),
        Path("c.pem"),
        Path("k.pem"),
        False,
    )


# ---- load_config: files ----


def test_load_config_reads_yaml(tmp_path: Path) -> None:
    path = tmp_path / "kvproxy.yaml"
    path.write_text("upstream:\n  bootstrap_servers: [kafka:9092]\nlisten:\n  port: 9300\n")
    config = load_config(path)
    assert config.listen.port == 9300


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read"):
        load_config(path)


def test_load_config_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("upstream: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
        load_config(path)


def test_load_config_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="the top level must be a mapping of sections"):
        load_config(path)


def test_load_config_empty_file_still_needs_upstream(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"{path}: 1 problem(s)\n  {path}:1: upstream is missing"


def test_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("upstream: {bootstrap_servers: [k:1]}\nshutdown: {drain_timeout: 5}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"{path}: 1 problem(s)\n"
        f"  {path}:2: shutdown.drain_timeout: unknown key (did you mean 'drain_timeout_ms'?)"
    )


def test_errors_are_sorted_by_line_and_name_it(tmp_path: Path) -> None:
    path = tmp_path / "lines.yaml"
    path.write_text(
        "# kvproxy\n"
        "upstream:\n"
        "  bootstrap_servers: [k:1]\n"
        "  tls: {ca: x}\n"
        "limits: {max_in_flight_requests: 0}\n"
        "listen:\n"
        "  port: 9300\n"
        "  host: [a]\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).splitlines() == [
        f"{path}: 3 problem(s)",
        f"  {path}:4: upstream.tls.ca: unknown key "
        "(known: ca_file, cert_file, check_hostname, key_file, key_password)",
        f"  {path}:5: limits.max_in_flight_requests: must be at least 1, not 0",
        f"  {path}:8: listen.host: must be a string, not ['a']",
    ]
    assert [problem.line for problem in caught.value.problems] == [4, 5, 8]


def test_rejection_log_limits_are_configurable() -> None:
    from kvproxy.proxy.serve.server import ProxyServer

    config = parse_config(
        {"upstream": UPSTREAM, "logs": {"rejections_per_window": 3, "rejection_window_ms": 500}}
    )
    server = ProxyServer(config)
    assert (server.sink.rejection_log.rate, server.sink.rejection_log.window_s) == (3, 0.5)
    with pytest.raises(ConfigError, match=r"logs\.rejections_per_window"):
        parse_config({"upstream": UPSTREAM, "logs": {"rejections_per_window": 0}})
