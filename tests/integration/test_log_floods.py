"""Output a peer can cause, bounded: thousands of clients while the broker is down write a few
lines, not two per connection; a TLS server name that is not ASCII is a JSON log line, not a
traceback CPython prints to stderr; a broker naming new addresses does not make a label each."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvproxy.proxy.ops.log_limits import DEFAULT_BURST
from kvproxy.proxy.ops.metrics import ProxyMetrics
from kvproxy.proxy.relay.upstream_dialer import MAX_OTHER_UPSTREAM_LABELS
from tests.harness import Broker
from tests.harness.metrics import closed
from tests.harness.named_ports import connect_failure_series, dial_new_ports
from tests.harness.processes import wait_until
from tests.harness.proxy import run_proxy
from tests.harness.sni import (
    BOOTSTRAP_NAME,
    CERTIFICATE_NAMES,
    running_sni_proxy,
    wait_for_sni,
)
from tests.harness.stub_upstream import StubCluster
from tests.harness.tls import make_tls_files
from tests.harness.upstream import TANSU_NODE_ID

CLIENTS = 300


def test_clients_while_the_broker_is_down_write_a_few_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """300 clients connect while the only broker is down: each is closed as no_upstream (counted
    for every one), and the log has at most five "unreachable" and five "closing connection"
    lines (before: 300 of each)."""
    caplog.set_level(logging.WARNING, "kvproxy")
    cluster = StubCluster((1,))
    with run_proxy(cluster.bootstrap, max_brokers=10) as running:
        cluster.close()
        socks = []
        for _ in range(CLIENTS):
            sock = socket.create_connection((running.host, running.port), timeout=10)
            socks.append(sock)
        wait_until(
            lambda: closed(running, "no_upstream") == CLIENTS, "every client closed", timeout=60
        )
        for sock in socks:
            sock.close()
    said = [r.getMessage() for r in caplog.records]
    unreachable = [line for line in said if " unreachable: " in line]
    closing = [line for line in said if line.startswith("closing connection: ")]
    assert 1 <= len(unreachable) <= DEFAULT_BURST, unreachable
    assert 1 <= len(closing) <= DEFAULT_BURST, closing
    assert all("no upstream reachable" in line for line in closing), closing


def test_connect_failures_to_addresses_a_broker_names_are_labelled_within_a_bound() -> None:
    """A broker naming node 0 at 100 new (closed) ports: the bootstrap server and the first 32
    addresses have their own `upstream` label, the rest are counted as `other` (before: one
    series per address, 1,501 for 1,500 ports)."""
    metrics = ProxyMetrics()
    bootstrap = dial_new_ports(100, metrics)
    series = connect_failure_series(metrics)
    assert len(series) == 1 + MAX_OTHER_UPSTREAM_LABELS + 1
    assert series[bootstrap] == 1
    assert series["other"] == 100 - MAX_OTHER_UPSTREAM_LABELS
    assert sum(series.values()) == 101


def _hello_naming(name: bytes) -> bytes:
    """A whole ClientHello whose server name is `name` (any bytes: Python's ssl writes only
    IDNA names, so a placeholder of the same length is replaced in the bytes)."""
    placeholder = b"x" * len(name)
    context = ssl.create_default_context()
    outgoing = ssl.MemoryBIO()
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=placeholder.decode())
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    assert hello.count(placeholder) == 1
    return hello.replace(placeholder, name)


@contextlib.contextmanager
def _json_sni_proxy(directory: Path, tansu: Broker) -> Iterator[Any]:
    with make_tls_files(hostnames=CERTIFICATE_NAMES) as tls:
        json_log = ("--log-format", "json")
        lowest = TANSU_NODE_ID - 1
        with running_sni_proxy(
            directory, [tansu.bootstrap], tls, arguments=json_log, lowest_node_id=lowest
        ) as stage:
            yield stage


def test_a_server_name_that_is_not_ascii_is_a_json_line_not_a_traceback(
    tansu: Broker, tmp_path: Path
) -> None:
    """100 handshakes naming b'\\xff\\xfe...': each refused, the log all JSON with at most five
    lines saying so, the server name escaped and clipped (before: CPython printed a 5-line
    "Exception ignored in: b'\\xff\\xfe...'" traceback to stderr per connection)."""
    hello = _hello_naming(b"\xff\xfe\xfd\xfc" + b"\x1b[2J" * 4 + b".kafka.localhost")
    with _json_sni_proxy(tmp_path, tansu) as (proxy, sni):
        for _ in range(100):
            with socket.create_connection(("127.0.0.1", sni.port), timeout=10) as sock:
                sock.sendall(hello)
                answer = sock.recv(64)  # an alert, then the close
                assert answer[:1] == b"\x15", answer  # TLS alert
        wait_for_sni(sni)  # and a good name is still served
        context = ssl.create_default_context(cafile=str(sni.ca))
        with (
            socket.create_connection(("127.0.0.1", sni.port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=BOOTSTRAP_NAME) as tls,
        ):
            assert tls.version() is not None
        time.sleep(0.5)
    text = proxy.log.read_text(errors="replace")
    assert "Exception ignored" not in text
    lines = [line for line in text.splitlines() if not line.startswith("--- start")]
    records = [json.loads(line) for line in lines]  # every line is JSON
    named = [r for r in records if r.get("event") == "tls_server_name_not_ascii"]
    assert 1 <= len(named) <= DEFAULT_BURST, named
    assert "\\xff\\xfe\\xfd\\xfc" in named[0]["message"]
    assert "\x1b" not in text
