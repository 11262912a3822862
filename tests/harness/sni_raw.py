"""A raw Kafka exchange over TLS to an SNI port, sending a chosen server name (or none).

Connects to 127.0.0.1 with `server_hostname` set, so nothing depends on name resolution, and
verifies the proxy's certificate against the test CA::

    with sni_connect(port, "bootstrap.kafka.localhost", tls.ca) as sock:
        metadata_brokers(sock, 12)        # [(node id, host, port), ...] as the answer names them
"""

from __future__ import annotations

import socket
import ssl
import struct
from pathlib import Path

from kvproxy.protocol.messages import METADATA, decode_response
from tests.harness.requests import metadata_request
from tests.harness.socket_frames import read_frame

__all__ = ["exchange", "metadata_brokers", "sni_connect"]


def sni_connect(
    port: int,
    name: str | None,
    ca: Path,
    *,
    client_cert: tuple[Path, Path] | None = None,
    host: str = "127.0.0.1",
) -> ssl.SSLSocket:
    """A TLS connection to `port` sending `name` (None: no server name, the chain still
    verified), with `client_cert` (certificate, key) for mutual TLS; ssl.SSLError when the
    handshake fails (the proxy's alert)."""
    context = ssl.create_default_context(cafile=str(ca))
    if client_cert is not None:
        context.load_cert_chain(*client_cert)
    if name is None:
        context.check_hostname = False  # nothing to check it against
    sock = socket.create_connection((host, port), timeout=10)
    try:
        return context.wrap_socket(sock, server_hostname=name)
    except BaseException:
        sock.close()
        raise


def exchange(sock: ssl.SSLSocket, payload: bytes) -> bytes:
    """Send one request frame, read one answer frame (without its size prefix)."""
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    return read_frame(sock)


def metadata_brokers(sock: ssl.SSLSocket, version: int) -> list[tuple[int, str, int]]:
    """The brokers a Metadata answer (v1 or v12) names, as (node id, host, port)."""
    answer = exchange(sock, metadata_request(version, 7))
    body = decode_response(answer, METADATA, version).body
    return [(int(b.node_id), str(b.host), int(b.port)) for b in body.brokers]
