"""Throw-away TLS material for tests: a self-signed CA, a server certificate, a client certificate.

Made with ``trustme`` (dev extra) in a temporary directory::

    with make_tls_files() as tls:             # or make_tls_files(directory) to keep the files
        tls.ca                                # Path: the CA certificate (PEM)
        tls.server_cert, tls.server_key       # server.pem / server.key for 127.0.0.1, localhost
        tls.client_cert, tls.client_key       # client.pem / client.key, signed by the same CA
        tls.server_context()                  # ssl.SSLContext for a server (optionally mTLS)
        tls.client_context()                  # ssl.SSLContext trusting the CA (optionally mTLS)

The server certificate carries the subject alternative names ``127.0.0.1``, ``localhost`` (plus any
``hostnames`` given), so clients that verify the host name (librdkafka's
``ssl.endpoint.identification.algorithm=https``) accept it on loopback.
"""

from __future__ import annotations

import contextlib
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TlsFiles", "make_tls_files", "write_tls_files"]


@dataclass(frozen=True)
class TlsFiles:
    """Paths of PEM files written by :func:`write_tls_files`."""

    directory: Path
    ca: Path  # ca.pem
    server_cert: Path  # server.pem (leaf certificate then the chain)
    server_key: Path  # server.key (unencrypted PKCS#8)
    client_cert: Path  # client.pem
    client_key: Path  # client.key

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.server_cert, self.server_key)
        if require_client_cert:
            ctx.load_verify_locations(cafile=self.ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def client_context(self, *, with_client_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if with_client_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx


def write_tls_files(
    directory: str | Path,
    *,
    hostnames: tuple[str, ...] = (),
    client_name: str = "kvproxy-test-client",
) -> TlsFiles:
    """Write ca.pem, server.pem, server.key, client.pem and client.key into ``directory``."""
    import trustme

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="kvproxy test CA")
    server = ca.issue_cert("127.0.0.1", "localhost", *hostnames)
    client = ca.issue_cert(client_name, common_name=client_name)
    files = TlsFiles(
        directory=out,
        ca=out / "ca.pem",
        server_cert=out / "server.pem",
        server_key=out / "server.key",
        client_cert=out / "client.pem",
        client_key=out / "client.key",
    )
    ca.cert_pem.write_to_path(str(files.ca))
    with files.server_cert.open("wb") as f:
        for blob in server.cert_chain_pems:
            f.write(blob.bytes())
    server.private_key_pem.write_to_path(str(files.server_key))
    with files.client_cert.open("wb") as f:
        for blob in client.cert_chain_pems:
            f.write(blob.bytes())
    client.private_key_pem.write_to_path(str(files.client_key))
    for key in (files.server_key, files.client_key):
        key.chmod(0o600)
    return files


@contextlib.contextmanager
def make_tls_files(
    directory: str | Path | None = None, *, hostnames: tuple[str, ...] = ()
) -> Iterator[TlsFiles]:
    """Yield fresh :class:`TlsFiles`; a temporary directory (removed afterwards) unless given."""
    if directory is not None:
        yield write_tls_files(directory, hostnames=hostnames)
        return
    with tempfile.TemporaryDirectory(prefix="kvproxy-tls-") as tmp:
        yield write_tls_files(tmp, hostnames=hostnames)
