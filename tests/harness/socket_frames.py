"""Reading size-prefixed Kafka frames from a blocking socket, for the raw clients and relays of
the tests and the benchmarks (one copy: a peer that closes mid-frame is a `ConnectionError`)."""

from __future__ import annotations

import socket

__all__ = ["read_exactly", "read_frame"]


def read_exactly(sock: socket.socket, size: int) -> bytes:
    """`size` bytes from `sock`, however many reads they take."""
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return bytes(data)


def read_frame(sock: socket.socket) -> bytes:
    """One size-prefixed frame from `sock`, without its prefix."""
    return read_exactly(sock, int.from_bytes(read_exactly(sock, 4), "big", signed=True))
