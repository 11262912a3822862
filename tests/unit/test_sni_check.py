"""`kvproxy check` describes the SNI listener beside the port-per-broker listeners: its address,
the names clients use and the port answers name, and what a client without a server name gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvproxy.cli import main
from tests.harness.tls import write_tls_files


def check_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str], listen: str) -> list[str]:
    tls = write_tls_files(tmp_path, hostnames=("*.kafka.localhost",))
    (tmp_path / "kvproxy.yaml").write_text(
        "listen:\n"
        f"  tls: {{cert_file: {tls.server_cert}, key_file: {tls.server_key}}}\n"
        f"{listen}"
        "upstream: {bootstrap_servers: ['127.0.0.1:1']}\n"
    )
    assert main(["check", "-c", str(tmp_path / "kvproxy.yaml")]) == 0
    return [line.strip() for line in capsys.readouterr().out.splitlines()]


SNI = """\
  sni:
    port: 9443
    bootstrap: bootstrap.kafka.localhost
    brokers: broker-$(nodeId).kafka.localhost
"""


def test_check_names_the_sni_listener_beside_the_port_per_broker_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = check_lines(tmp_path, capsys, SNI)
    assert lines[1:4] == [
        "bootstrap listener: 127.0.0.1:9192 (TLS), advertised as 127.0.0.1",
        "broker listeners: node N -> port 9193 + (N mod 100), ports 9193-9292",
        "SNI listener: 127.0.0.1:9443 (TLS), bootstrap bootstrap.kafka.localhost:9443, brokers "
        "broker-$(nodeId).kafka.localhost:9443, without a server name: refused",
    ]


def test_check_with_the_sni_listener_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listen = (
        "  port_per_broker: false\n"
        + SNI
        + "    host: 0.0.0.0\n    advertised_port: 443\n    without_sni: bootstrap\n"
    )
    lines = check_lines(tmp_path, capsys, listen)
    assert lines[1:3] == [
        "port-per-broker listeners: none (listen.port_per_broker: false)",
        "SNI listener: 0.0.0.0:9443 (TLS), bootstrap bootstrap.kafka.localhost:443, brokers "
        "broker-$(nodeId).kafka.localhost:443, without a server name: the bootstrap",
    ]
