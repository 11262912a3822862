"""kvproxy.proxy.config.proxy_config `limits`: the connection, timeout and record limits' defaults
and
validation."""

from __future__ import annotations

from typing import Any

import pytest

from kvproxy.commands.cli import describe
from kvproxy.proxy.config.proxy_config import parse_config
from kvproxy.proxy.ops import fds
from kvproxy.settings.loading import ConfigError

UPSTREAM = {"bootstrap_servers": ["kafka:9092"]}


def error_of(limits: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config({"upstream": UPSTREAM, "limits": limits}, "test.yaml")
    return str(caught.value)


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fds, "open_file_limit_target", lambda: 1_048_576)
    limits = parse_config({"upstream": UPSTREAM}).limits
    assert limits.max_connections_per_listener == 10_000
    assert limits.max_connections_per_client == 1_000
    assert limits.idle_timeout_ms == 600_000
    assert limits.request_timeout_ms == 30_000
    assert limits.max_records_per_request == 1_000_000


@pytest.mark.parametrize(("open_files", "per_listener"), [(20_000, 9_872), (1024, 384), (300, 22)])
def test_an_unset_connection_limit_is_what_the_open_file_limit_has_room_for(
    monkeypatch: pytest.MonkeyPatch, open_files: int, per_listener: int
) -> None:
    """Two descriptors per connection, 256 kept for the proxy's own; a value set stays."""
    monkeypatch.setattr(fds, "open_file_limit_target", lambda: open_files)
    assert parse_config({"upstream": UPSTREAM}).limits.max_connections_per_listener == per_listener
    limits = {"max_connections_per_listener": 10_000}
    set_too_high = parse_config({"upstream": UPSTREAM, "limits": limits}).limits
    assert set_too_high.max_connections_per_listener == 10_000


def test_values_are_read() -> None:
    limits = parse_config(
        {
            "upstream": UPSTREAM,
            "limits": {
                "max_connections_per_listener": 5,
                "max_connections_per_client": 2,
                "idle_timeout_ms": 300,
                "request_timeout_ms": 200,
                "max_records_per_request": 10,
            },
        }
    ).limits
    assert (
        limits.max_connections_per_listener,
        limits.max_connections_per_client,
        limits.idle_timeout_ms,
        limits.request_timeout_ms,
        limits.max_records_per_request,
    ) == (5, 2, 300, 200, 10)


@pytest.mark.parametrize(
    ("key", "bad", "bound"),
    [
        ("max_connections_per_listener", 0, "must be at least 1"),
        ("max_connections_per_client", -1, "must be at least 1"),
        ("idle_timeout_ms", 0, "must be at least 10"),
        ("request_timeout_ms", 5, "must be at least 10"),
        ("max_records_per_request", 0, "must be at least 1"),
        ("idle_timeout_ms", "soon", "must be a whole number, not 'soon'"),
    ],
)
def test_bad_values_name_the_key(key: str, bad: Any, bound: str) -> None:
    message = error_of({key: bad})
    assert f"limits.{key}:" in message
    assert bound in message


def test_unknown_limit_is_an_error() -> None:
    assert "limits.max_connections: unknown key" in error_of({"max_connections": 5})


def test_check_prints_every_limit() -> None:
    config = parse_config(
        {
            "upstream": UPSTREAM,
            "limits": {
                "max_connections_per_listener": 5,
                "max_connections_per_client": 2,
                "idle_timeout_ms": 300,
                "request_timeout_ms": 200,
                "max_records_per_request": 10,
            },
        }
    )
    lines = describe(config)
    assert (
        "limits: frames up to 104857600 bytes, 100 requests in flight per connection, "
        "10 records per produce request"
    ) in lines
    assert (
        "connections: 5 per listener, 2 per client address; closed after 300 ms idle or "
        "200 ms stalled inside a request"
    ) in lines
