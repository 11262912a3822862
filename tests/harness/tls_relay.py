"""A TLS-terminating relay in front of a plain broker, to test the proxy's TLS to its upstream.

Tansu speaks plain TCP only; with this relay in front (and Tansu advertising the relay's port),
the proxy must connect to the "broker" with TLS and verify its certificate.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            target.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def run_tls_relay(
    listener: socket.socket, target: tuple[str, int], context: ssl.SSLContext
) -> Iterator[None]:
    """Serve TLS on the already-bound `listener`, relaying plain bytes to `target`."""
    listener.listen()
    listener.settimeout(0.2)
    stop = threading.Event()

    def accept_loop() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            raw.settimeout(None)
            try:
                secure = context.wrap_socket(raw, server_side=True)
                upstream = socket.create_connection(target)
            except (OSError, ssl.SSLError):
                raw.close()
                continue
            for a, b in ((secure, upstream), (upstream, secure)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(2)
        listener.close()
