"""A relay that flips one bit of any client request carrying a marker: how a test makes a real
client (which never builds a bad CRC) send a batch whose CRC does not match.

The proxy advertises `RELAY_HOST`; a `FlippingRelay` on each of its ports there forwards every
connection to the proxy on 127.0.0.1, with `MARK` replaced by `FLIPPED` in requests (one bit,
inside the bytes the batch CRC covers). Answers pass through unchanged. Loopback only; threads.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

from tests.harness.socket_frames import read_frame

RELAY_HOST = "127.0.0.2"
PROXY_HOST = "127.0.0.1"
MARK = b"flip-me"
FLIPPED = b"flip-md"  # "e" 0x65 -> "d" 0x64: one bit


class FlippingRelay:
    """Forwards connections from `listen` to `target`, flipping MARK in client requests."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
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
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._answers, args=(upstream, client), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while True:
                flipped = read_frame(client).replace(MARK, FLIPPED)
                upstream.sendall(struct.pack(">i", len(flipped)) + flipped)
        except (EOFError, OSError):
            pass
        _shut(client, upstream)

    @staticmethod
    def _answers(upstream: socket.socket, client: socket.socket) -> None:
        try:
            while chunk := upstream.recv(65536):
                client.sendall(chunk)
        except OSError:
            pass
        _shut(client, upstream)


def _shut(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
