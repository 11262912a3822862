"""A TCP relay in front of a broker that counts what the proxy sends upstream.

The proxy's own requests to the cluster (DescribeConfigs, Metadata) travel on connections of
their own; a test puts this relay between the proxy and the broker and reads how many
connections were opened and how many requests of each api key went through.

Usage::

    with run_counting_relay(("127.0.0.1", broker_port)) as relay:
        relay.bootstrap               # "127.0.0.1:<port>": give it to the proxy
        relay.requests(api_key)       # requests of that api key seen so far
        relay.connections_with(api_key)  # connections that carried at least one such request

Threads and blocking sockets; every connection gets two pump threads.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections import Counter
from collections.abc import Iterator

__all__ = ["CountingRelay", "run_counting_relay"]


class CountingRelay:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._server = socket.create_server(("127.0.0.1", 0))
        self._lock = threading.Lock()
        self._requests: Counter[int] = Counter()
        self._connections: list[set[int]] = []
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self._server.getsockname()[1]}"

    @property
    def connections(self) -> int:
        """Connections accepted so far."""
        with self._lock:
            return len(self._connections)

    def requests(self, api_key: int) -> int:
        with self._lock:
            return self._requests[api_key]

    def connections_with(self, *api_keys: int) -> int:
        """Connections that carried at least one request of one of `api_keys`."""
        with self._lock:
            return sum(1 for keys in self._connections if keys & set(api_keys))

    def close(self) -> None:
        self._closed = True
        self._server.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._upstream)
            except OSError:
                client.close()
                continue
            keys: set[int] = set()
            with self._lock:
                self._connections.append(keys)
                self._sockets += [client, upstream]
            threading.Thread(
                target=self._requests_pump, args=(client, upstream, keys), daemon=True
            ).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _requests_pump(self, source: socket.socket, sink: socket.socket, keys: set[int]) -> None:
        buffer = b""
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
                buffer += chunk
                while len(buffer) >= 6:
                    size = struct.unpack_from(">i", buffer)[0]
                    if len(buffer) < 4 + size:
                        break
                    api_key = struct.unpack_from(">h", buffer, 4)[0]
                    buffer = buffer[4 + size :]
                    with self._lock:
                        self._requests[api_key] += 1
                        keys.add(api_key)
        except OSError:
            pass
        finally:
            _close(source, sink)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            _close(source, sink)


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()


@contextlib.contextmanager
def run_counting_relay(upstream: tuple[str, int]) -> Iterator[CountingRelay]:
    relay = CountingRelay(upstream)
    try:
        yield relay
    finally:
        relay.close()
