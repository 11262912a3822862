"""TLS handshakes in progress, counted from accept: a connection is admitted to its handshake only
while its address and its listener are under the connection limits (open connections and
handshakes in progress together) and the handshakes in progress are under their bounds
(`limits.max_tls_handshakes`, `limits.max_tls_handshakes_per_client`); one beyond is closed at
once, before any TLS session is made for it (`too_many_connections` or `too_many_handshakes`,
logged as the other connection refusals are).

A handshake begun while half of `max_tls_handshakes` or more are in progress gets the short
timeout `limits.tls_handshake_pressure_timeout_ms`: stalled handshakes give their slots back
sooner, and those already under way (real clients among them) are never cut short. After a burst
of handshakes (256 or more in progress, then a quarter of that) the memory their sessions held is
handed back to the system: a full garbage collection (the TLS protocol and its app protocol make a
reference cycle) and glibc's `malloc_trim`.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Callable
from typing import Any, Final

from kvproxy.proxy.config.proxy_config import LimitsConfig
from kvproxy.proxy.listen.client_connections import ClientConnections
from kvproxy.proxy.relay.close_reasons import CloseReason

TRIM_AFTER: Final = 256
"""Handshakes in progress at the peak of a burst after which the memory is trimmed."""

ListenerKey = tuple[str, int | None]


class HandshakeGate:
    """The handshakes in progress in this process: in total, per address and per listener."""

    def __init__(self, limits: LimitsConfig, connections: ClientConnections) -> None:
        self._limits = limits
        self._connections = connections
        self.in_progress = 0
        self._per_client: collections.Counter[str] = collections.Counter()
        self._per_listener: collections.Counter[ListenerKey] = collections.Counter()
        self._peak = 0

    def __call__(
        self,
        make: Callable[[float, Callable[[], None]], asyncio.BaseProtocol],
        listener: ListenerKey,
    ) -> asyncio.BaseProtocol:
        """`kvproxy.proxy.listen.tls_accept.Gate`: the protocol of a connection just accepted."""
        return GatedAccept(self, listener, make)

    def timeout_s(self) -> float:
        """The timeout of a handshake beginning now (the short one under pressure)."""
        limits = self._limits
        if self.in_progress * 2 >= limits.max_tls_handshakes:
            return limits.tls_handshake_pressure_timeout_ms / 1000
        return limits.tls_handshake_timeout_ms / 1000

    def admit(self, host: str, listener: ListenerKey) -> Callable[[], None] | None:
        """Count a handshake from `host` on `listener`: what ends its count (call once it is
        done, either way), or None when it is refused (counted and logged as such)."""
        limits, connections = self._limits, self._connections
        if (
            self.in_progress >= limits.max_tls_handshakes
            or self._per_client[host] >= limits.max_tls_handshakes_per_client
        ):
            connections.refuse(CloseReason.TOO_MANY_HANDSHAKES)
            return None
        if (
            connections.open_from(host) + self._per_client[host]
            >= limits.max_connections_per_client
            or connections.open_on(listener) + self._per_listener[listener]
            >= limits.max_connections_per_listener
        ):
            connections.refuse(CloseReason.TOO_MANY_CONNECTIONS)
            return None
        self.in_progress += 1
        self._per_client[host] += 1
        self._per_listener[listener] += 1
        self._peak = max(self._peak, self.in_progress)
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                self._ended(host, listener)

        return end

    def _ended(self, host: str, listener: ListenerKey) -> None:
        self.in_progress -= 1
        _forget(self._per_client, host)
        _forget(self._per_listener, listener)
        if self._peak >= TRIM_AFTER and self.in_progress * 4 <= self._peak:
            self._peak = self.in_progress
            asyncio.get_running_loop().call_soon(trim_memory)


def _forget(counts: collections.Counter[Any], key: Any) -> None:
    if counts[key] <= 1:
        del counts[key]
    else:
        counts[key] -= 1


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to call
        return None
    return trim


def trim_memory() -> None:
    """Collect the reference cycles a TLS protocol and its app protocol make (they hold the
    sessions' buffers until collected), then hand the free memory of the C heap back to the
    system (glibc only)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class GatedAccept(asyncio.Protocol):
    """What a TLS listener's factory returns: at `connection_made` (the peer known) the gate
    admits the connection or it is closed at once; an admitted one is handed to its TLS protocol
    (`make`: the handshake's timeout and what ends its count -> the protocol), made only then."""

    def __init__(
        self,
        gate: HandshakeGate,
        listener: ListenerKey,
        make: Callable[[float, Callable[[], None]], asyncio.BaseProtocol],
    ) -> None:
        self._gate = gate
        self._listener = listener
        self._make = make

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        timeout_s = self._gate.timeout_s()
        end = self._gate.admit(host, self._listener)
        if end is None:
            transport.abort()  # type: ignore[attr-defined]  # a transport, not just a base one
            return
        protocol = self._make(timeout_s, end)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        """Bytes of a refused connection before its close: ignored."""
