"""A tiny synchronous Kafka socket client for tests.

It sends hand-built frames and reads whole response frames. It deliberately does not import
anything from ``protocol/`` so that the harness stays independent of the code under test.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time

__all__ = [
    "RawKafkaClient",
    "api_versions_v0_request",
    "parse_api_versions_v0_response",
]


class RawClientError(Exception):
    """The peer closed the connection or did not answer in time."""


class RawKafkaClient:
    """A blocking TCP connection speaking size-prefixed Kafka frames."""

    def __init__(self, host: str, port: int, *, connect_timeout: float = 5.0) -> None:
        self.host = host
        self.port = port
        self._sock = socket.create_connection((host, port), timeout=connect_timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        self._closed = False

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> RawKafkaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- frames ----------------------------------------------------------------------------
    def send_frame(self, payload: bytes) -> None:
        """Send ``payload`` with its 4-byte big-endian size prefix."""
        self._sock.sendall(struct.pack(">i", len(payload)) + payload)

    def send_raw(self, data: bytes) -> None:
        """Send bytes exactly as given (no size prefix added)."""
        self._sock.sendall(data)

    def recv_frame(self, timeout: float = 5.0) -> bytes:
        """Read one whole response frame and return it without its size prefix."""
        deadline = time.monotonic() + timeout
        self._fill(4, deadline)
        (size,) = struct.unpack_from(">i", self._buf, 0)
        if size < 0:
            raise RawClientError(f"negative frame size {size} from {self.host}:{self.port}")
        self._fill(4 + size, deadline)
        payload = bytes(self._buf[4 : 4 + size])
        del self._buf[: 4 + size]
        return payload

    def request(self, payload: bytes, timeout: float = 5.0) -> bytes:
        """Send one request frame and return the next response frame."""
        self.send_frame(payload)
        return self.recv_frame(timeout)

    def is_closed_by_peer(self, timeout: float = 2.0) -> bool:
        """Wait up to ``timeout`` for the peer to close the connection.

        Returns True on EOF or connection reset, False if the connection is still open when the
        timeout expires. Any bytes that arrive meanwhile are kept for ``recv_frame``.
        """
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._sock.settimeout(remaining)
            try:
                chunk = self._sock.recv(65536)
            except TimeoutError:
                return False
            except (ConnectionResetError, BrokenPipeError):
                return True
            if not chunk:
                return True
            self._buf += chunk

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(OSError):
                self._sock.close()

    # -- internals -------------------------------------------------------------------------
    def _fill(self, n: int, deadline: float) -> None:
        while len(self._buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RawClientError(
                    f"timed out waiting for a response frame from {self.host}:{self.port} "
                    f"(have {len(self._buf)} of {n} bytes)"
                )
            self._sock.settimeout(remaining)
            try:
                chunk = self._sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError as exc:
                raise RawClientError(
                    f"connection reset by {self.host}:{self.port} "
                    f"(have {len(self._buf)} of {n} bytes)"
                ) from exc
            if not chunk:
                raise RawClientError(
                    f"connection closed by {self.host}:{self.port} "
                    f"(have {len(self._buf)} of {n} bytes)"
                )
            self._buf += chunk


def api_versions_v0_request(
    correlation_id: int = 1, client_id: str | None = "kvproxy-test"
) -> bytes:
    """An ApiVersions v0 request (request header v1, empty body), without size prefix."""
    if client_id is None:
        cid = struct.pack(">h", -1)
    else:
        raw = client_id.encode()
        cid = struct.pack(">h", len(raw)) + raw
    return struct.pack(">hhi", 18, 0, correlation_id) + cid


def parse_api_versions_v0_response(payload: bytes) -> tuple[int, int, dict[int, tuple[int, int]]]:
    """Parse an ApiVersions v0 response: ``(correlation_id, error_code, {api_key: (min, max)})``."""
    correlation_id, error_code, count = struct.unpack_from(">ihi", payload, 0)
    pos = 10
    apis: dict[int, tuple[int, int]] = {}
    for _ in range(max(count, 0)):
        key, lo, hi = struct.unpack_from(">hhh", payload, pos)
        pos += 6
        apis[key] = (lo, hi)
    return correlation_id, error_code, apis
