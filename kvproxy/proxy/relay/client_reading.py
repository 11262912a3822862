"""The reading side of a client connection: why it does not read now, and for how long it has
not received anything.

Reading stops while any hold (`PauseReason`) is on, whether the proxy put it (connecting
upstream, deciding a request) or the client caused it (answers it does not read, a full upstream,
a large frame waiting for receive memory). The listeners' sweep asks `check` whether the client
has been idle, or stalled inside a frame, for too long; a read only adds to `received`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.framing import FrameDecoder
from kvproxy.proxy.relay.close_reasons import CloseReason, PauseReason
from kvproxy.proxy.relay.receive_memory import FrameClock

if TYPE_CHECKING:
    from kvproxy.proxy.relay.client_connection import ClientConnection


class ClientReading:
    """The holds on one client connection's reading, and its idle, stall and frame clocks."""

    __slots__ = (
        "_decoder",
        "_frame_clock",
        "_idle_since",
        "_quiet_since",
        "_seen_received",
        "paused_for",
        "received",
        "transport",
    )

    def __init__(self, decoder: FrameDecoder, frame_receive_timeout_ms: int) -> None:
        self._decoder = decoder
        self.transport: asyncio.Transport | None = None
        self.paused_for: set[PauseReason] = set()
        """Why reading is stopped now: it resumes when the last reason goes."""
        self.received = 0
        """Bytes read from the client; the sweep compares it with what it saw last."""
        self._seen_received = 0
        self._quiet_since = 0.0
        """When the sweep last saw bytes arrive (or reading paused by the proxy itself)."""
        self._idle_since = 0.0
        """As `_quiet_since`, and also moved on while a request is in flight."""
        self._frame_clock = FrameClock(frame_receive_timeout_ms)

    def started(self, transport: asyncio.Transport, now: float) -> None:
        self.transport = transport
        self._quiet_since = self._idle_since = now

    def pause(self, reason: PauseReason) -> None:
        self.paused_for.add(reason)
        self.enforce()

    def enforce(self) -> None:
        """Stop the transport reading while any reason holds. Checked again after each read:
        uvloop starts reading after `connection_made` returns, whatever was asked in it."""
        transport = self.transport
        if (
            self.paused_for
            and transport is not None
            and not transport.is_closing()
            and transport.is_reading()
        ):
            transport.pause_reading()

    def resume(self, reason: PauseReason) -> None:
        if reason not in self.paused_for:
            return
        self.paused_for.discard(reason)
        transport = self.transport
        if (
            not self.paused_for
            and transport is not None
            and not transport.is_closing()
            and not transport.is_reading()
        ):
            transport.resume_reading()

    def retry_frame(self) -> bool:
        """Try again to start the large frame that waited for receive memory; True once it has
        (reading resumes)."""
        try:
            self._decoder.next_frame()  # cannot complete: only reserves and starts its buffer
        except ProtocolError:  # checked when its prefix came; kept for safety
            return True
        if self._decoder.waiting is not None:
            return False
        self.resume(PauseReason.MEMORY)
        return True

    def check(
        self, client: ClientConnection, now: float, idle_after: float, stall_after: float
    ) -> None:
        """Close `client` if it has been idle, or stalled inside a frame, for too long.

        Time during which the proxy itself does not read (backpressure, connecting upstream,
        waiting for topic configs) counts as activity, not as a stall.
        """
        decoder = self._decoder
        if self._frame_clock.overdue(now, decoder, self.paused_for):
            client.state.receive.close_overdue(client, self._frame_clock, decoder)
            return
        received = self.received
        if received != self._seen_received or self.paused_for:
            self._seen_received = received
            self._quiet_since = self._idle_since = now
            return
        if client.in_flight:
            self._idle_since = now
        if decoder.buffered:
            if now - self._quiet_since >= stall_after:
                client.abort(
                    f"client {client.peer} sent part of a request and nothing more for "
                    f"{now - self._quiet_since:.1f} s",
                    logging.INFO,
                    reason=CloseReason.SLOW_REQUEST,
                )
        elif now - self._idle_since >= idle_after:
            client.abort(
                f"client {client.peer} idle for {now - self._idle_since:.1f} s",
                logging.DEBUG,
                reason=CloseReason.IDLE,
            )
