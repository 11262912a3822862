"""Self-tests of the TLS test material (tests/harness/tls.py): plain ssl handshakes on loopback."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator

import pytest

from tests.harness.tls import TlsFiles, make_tls_files


@pytest.fixture(scope="module")
def tls() -> Iterator[TlsFiles]:
    with make_tls_files() as files:
        yield files


def _serve_once(ctx: ssl.SSLContext) -> tuple[int, threading.Thread, list[object]]:
    """Accept one TLS connection, echo one message; record the outcome (bytes or exception)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    outcome: list[object] = []

    def run() -> None:
        with listener:
            listener.settimeout(5)
            conn, _ = listener.accept()
            try:
                with ctx.wrap_socket(conn, server_side=True) as tls_conn:
                    data = tls_conn.recv(100)
                    tls_conn.sendall(data.upper())
                    peer = tls_conn.getpeercert()
                    outcome.append((data, peer))
            except (ssl.SSLError, OSError) as exc:
                outcome.append(exc)
                conn.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return port, t, outcome


def _client(ctx: ssl.SSLContext, port: int, server_hostname: str) -> bytes:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=server_hostname) as conn,
    ):
        conn.sendall(b"hello")
        return conn.recv(100)


def test_files_exist(tls: TlsFiles) -> None:
    for path in (tls.ca, tls.server_cert, tls.server_key, tls.client_cert, tls.client_key):
        assert path.is_file()
        assert path.read_bytes().startswith(b"-----BEGIN ")
    assert tls.server_key.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("hostname", ["127.0.0.1", "localhost"])
def test_handshake_with_ca(tls: TlsFiles, hostname: str) -> None:
    port, thread, outcome = _serve_once(tls.server_context())
    assert _client(tls.client_context(), port, hostname) == b"HELLO"
    thread.join(5)
    assert outcome and outcome[0] == (b"hello", None)


def test_mutual_tls(tls: TlsFiles) -> None:
    port, thread, outcome = _serve_once(tls.server_context(require_client_cert=True))
    assert _client(tls.client_context(with_client_cert=True), port, "127.0.0.1") == b"HELLO"
    thread.join(5)
    data, peer = outcome[0]  # type: ignore[misc]
    assert data == b"hello"
    subject = dict(item for rdn in peer["subject"] for item in rdn)
    assert subject["commonName"] == "kvproxy-test-client"


def test_client_without_ca_fails_verification(tls: TlsFiles) -> None:
    port, thread, _ = _serve_once(tls.server_context())
    ctx = ssl.create_default_context()  # the system's CAs only: the test CA is not among them
    with pytest.raises(ssl.SSLCertVerificationError):
        _client(ctx, port, "127.0.0.1")
    thread.join(5)


def test_wrong_hostname_fails_verification(tls: TlsFiles) -> None:
    port, thread, _ = _serve_once(tls.server_context())
    with pytest.raises(ssl.SSLCertVerificationError):
        _client(tls.client_context(), port, "example.com")
    thread.join(5)


def test_mtls_server_refuses_client_without_cert(tls: TlsFiles) -> None:
    port, thread, outcome = _serve_once(tls.server_context(require_client_cert=True))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _client(tls.client_context(), port, "127.0.0.1")
    thread.join(5)
    assert outcome and isinstance(outcome[0], (ssl.SSLError, OSError))


def test_other_ca_does_not_verify(tls: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> None:
    other = make_tls_files(tmp_path_factory.mktemp("other-ca"))
    with other as other_files:
        port, thread, _ = _serve_once(tls.server_context())
        with pytest.raises(ssl.SSLCertVerificationError):
            _client(other_files.client_context(), port, "127.0.0.1")
        thread.join(5)
