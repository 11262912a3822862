"""A relay that lowers the highest version of one API in the ApiVersions answers it passes on: a
real client behind it negotiates as with an older proxy, so a test can run the same thing at two
versions of an API (Produce v12 and v13) through the same kvproxy.

The proxy advertises the relay's host; one `VersionCapRelay` on each of its ports there forwards
every connection to the proxy's same port on 127.0.0.1. Requests pass unchanged; an answer to an
ApiVersions request (any version) has the API's `max_version` lowered in place. Loopback only;
threads. Imports nothing of the code under test.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

from tests.harness.socket_frames import read_frame

__all__ = ["cap_api_versions", "capped_versions"]

API_VERSIONS = 18
TARGET_HOST = "127.0.0.1"


def _uvarint(buf: bytes | bytearray, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def cap_api_versions(frame: bytes, version: int, api_key: int, highest: int) -> bytes:
    """An ApiVersions answer frame (no size prefix) of request `version` with `api_key`
    offered up to `highest` at most (its lowest version kept)."""
    out = bytearray(frame)
    pos = 6  # correlation id, error code
    if version >= 3:
        count, pos = _uvarint(out, pos)
        count -= 1
    else:
        (count,) = struct.unpack_from(">i", out, pos)
        pos += 4
    for _ in range(max(count, 0)):
        key, low, high = struct.unpack_from(">hhh", out, pos)
        if key == api_key and high > highest:
            struct.pack_into(">h", out, pos + 4, max(low, highest))
        pos += 6
        if version >= 3:
            tags, pos = _uvarint(out, pos)
            assert tags == 0, "an ApiVersions entry with tagged fields"
    return bytes(out)


class VersionCapRelay:
    """Forwards connections from `listen` to `target`, capping `api_key` in ApiVersions."""

    def __init__(
        self, listen: tuple[str, int], target: tuple[str, int], api_key: int, highest: int
    ) -> None:
        self.target, self.api_key, self.highest = target, api_key, highest
        self._server = socket.create_server(listen)
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._server.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            asked: dict[int, int] = {}  # correlation id -> ApiVersions version, of this connection
            for pump in (self._requests, self._answers):
                threading.Thread(target=pump, args=(client, upstream, asked), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket, asked: dict) -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                frame = read_frame(client)
                key, version, correlation_id = struct.unpack_from(">hhi", frame)
                if key == API_VERSIONS:
                    asked[correlation_id] = version  # before the request leaves: no race
                upstream.sendall(struct.pack(">i", len(frame)) + frame)
        _shut(client, upstream)

    def _answers(self, client: socket.socket, upstream: socket.socket, asked: dict) -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                frame = read_frame(upstream)
                version = asked.pop(struct.unpack_from(">i", frame)[0], None)
                if version is not None:
                    frame = cap_api_versions(frame, version, self.api_key, self.highest)
                client.sendall(struct.pack(">i", len(frame)) + frame)
        _shut(client, upstream)


@contextlib.contextmanager
def capped_versions(
    host: str, ports: list[int], api_key: int, highest: int
) -> Iterator[list[VersionCapRelay]]:
    """A relay on `host` at each of `ports`, to the same port on 127.0.0.1."""
    relays = [
        VersionCapRelay((host, port), (TARGET_HOST, port), api_key, highest) for port in ports
    ]
    try:
        yield relays
    finally:
        for relay in relays:
            relay.close()


def _shut(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
