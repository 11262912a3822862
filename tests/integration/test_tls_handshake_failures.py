"""kcat refused by the proxy's mutual TLS leaves a trace: a log line naming the reason, and
kvproxy_tls_handshake_failures_total counted by listener and reason."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Broker
from tests.harness.kcat import run_kcat
from tests.harness.metrics import scrape, value
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.tls import TlsFiles, make_tls_files
from tests.harness.tls_clients import ClientCert, ClientCerts, write_client_certs

FAILURES = "kvproxy_tls_handshake_failures_total"


@pytest.fixture(scope="module")
def tls() -> Iterator[TlsFiles]:
    with make_tls_files() as files:
        yield files


def kcat_metadata(proxy: RunningProxy, tls: TlsFiles, client: ClientCert | None) -> int:
    """`kcat -L` over TLS through the proxy (with `client`'s certificate); its exit code."""
    args = ["-b", proxy.bootstrap, "-L", "-m", "5", "-X", "security.protocol=SSL"]
    args += ["-X", f"ssl.ca.location={tls.ca}"]
    if client is not None:
        args += ["-X", f"ssl.certificate.location={client.cert}"]
        args += ["-X", f"ssl.key.location={client.key}"]
    return run_kcat(args).returncode


def counted(proxy: RunningProxy) -> dict[str, float]:
    """The failures counted on the bootstrap listener, by reason."""
    samples = scrape(proxy)
    return {
        dict(labels)["reason"]: count
        for (name, labels), count in samples.items()
        if name == FAILURES and dict(labels)["listener"] == "bootstrap"
    }


def test_kcat_refused_by_mutual_tls_is_logged_and_counted_by_reason(
    tansu: Broker, tls: TlsFiles, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clients: ClientCerts = write_client_certs(tmp_path)
    listen = {
        "tls": {
            "cert_file": str(tls.server_cert),
            "key_file": str(tls.server_key),
            "client_ca_file": str(clients.ca),
        }
    }
    with (
        caplog.at_level(logging.WARNING, logger="kvproxy"),
        run_proxy(tansu.bootstrap, listen=listen) as proxy,
    ):
        assert kcat_metadata(proxy, tls, clients.trusted) == 0
        assert counted(proxy) == {}
        assert kcat_metadata(proxy, tls, None) != 0
        assert kcat_metadata(proxy, tls, clients.other_ca) != 0
        deadline = time.monotonic() + 10
        while not {"no_client_certificate", "unknown_ca"} <= set(counted(proxy)):
            assert time.monotonic() < deadline, counted(proxy)
            time.sleep(0.05)
        assert value(scrape(proxy), FAILURES, listener="broker", reason="unknown_ca") == 0
    # librdkafka retries: a line per reason, the others counted (a line per 10 s at most). On a
    # loaded machine one of its retries may be cut short mid-handshake, a third reason (`other`,
    # "unexpected message", or `closed`), counted and logged apart: only the two are read here.
    wanted = (": no_client_certificate (", ": unknown_ca (")
    logged = [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith("TLS handshake failed on ")
        and any(reason in r.getMessage() for reason in wanted)
    ]
    assert len(logged) == 2
    no_certificate, other_ca = logged
    assert no_certificate.startswith(
        "TLS handshake failed on the bootstrap listener from 127.0.0.1:"
    )
    assert no_certificate.endswith(
        ", server name none: no_client_certificate (peer did not return a certificate)"
    )
    assert other_ca.endswith(
        ", server name none: unknown_ca "
        "(certificate verify failed: unable to get local issuer certificate)"
    )
