"""Receive memory: what the large frames being received from clients hold, who waits for it,
and how long one frame may hold it.

A large frame reserves its declared size when its size prefix arrives (`kvproxy.protocol.framing`)
and keeps it until it is complete. A frame that cannot reserve waits, unread, oldest first. What
bounds the wait is the time a frame may take to arrive once it holds its reservation
(`limits.frame_receive_timeout_ms`): measured from its reservation, not from its last byte, so a
client sending a byte now and then holds the memory no longer than one that sends nothing.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Collection
from typing import TYPE_CHECKING

from kvproxy.protocol.budget import MemoryBudget
from kvproxy.protocol.framing import FrameDecoder
from kvproxy.proxy.ops.metrics import ProxyMetrics
from kvproxy.proxy.relay.close_reasons import CloseReason, PauseReason

if TYPE_CHECKING:
    from kvproxy.proxy.relay.client_connection import ClientConnection

log = logging.getLogger("kvproxy")

LOG_INTERVAL_S = 10.0
"""Waits and closes are logged at most once per interval each, with a count of the rest."""


PROXY_HOLDS = frozenset({PauseReason.CONNECTING, PauseReason.PRODUCE})
"""Holds on reading that the proxy itself puts and lifts (connecting upstream, deciding a
request): while one is on, a frame's clock stops. Holds a client can cause (answers it does not
read fill `max_in_flight_requests`) do not stop it, or not reading would keep memory for ever."""


class FrameClock:
    """How long one connection's reserved frame has been received for, as the sweep sees it.

    Time during which the proxy itself holds reading (`PROXY_HOLDS`) does not count: the client
    could not send then."""

    __slots__ = ("_frame", "_last", "limit_ms", "spent")

    def __init__(self, limit_ms: int) -> None:
        self.limit_ms = limit_ms
        """`limits.frame_receive_timeout_ms`."""
        self._frame: int | None = None
        self._last = 0.0
        self.spent = 0.0
        """Seconds the current reserved frame has been received for (as of `overdue`)."""

    def overdue(
        self, now: float, decoder: FrameDecoder, held: Collection[PauseReason] = ()
    ) -> bool:
        """Advance to `now`: True once the frame `decoder` is receiving has held its reservation
        for `limit_ms`; `held` are the holds on reading now. Called by the sweep (a tick at most
        a tenth of the limit)."""
        frame = decoder.reserved_frame
        if frame is None or frame != self._frame:
            self._frame = frame
            self.spent = 0.0
        elif PROXY_HOLDS.isdisjoint(held):
            self.spent += now - self._last
        self._last = now
        return frame is not None and self.spent * 1000 >= self.limit_ms


class ReceiveMemory(MemoryBudget):
    """Receive memory served in turn: while connections wait for it, a frame that has not
    waited is refused and queues behind them, so frames that each fit in what is left cannot
    keep a larger waiting frame out for ever."""

    __slots__ = ("queued", "serving")

    def __init__(self, limit: int, name: str = "limits.receive_buffer_bytes") -> None:
        super().__init__(limit, name)
        self.queued = 0
        """Connections waiting (`ReceiveWaiters`)."""
        self.serving = False
        """True while the waiters are served, oldest first: only they may take memory then."""

    def try_take(self, nbytes: int) -> bool:
        if self.queued and not self.serving:
            return False
        return super().try_take(nbytes)


class ReceiveWaiters:
    """Connections whose next large frame waits for receive memory, oldest first."""

    def __init__(self, memory: ReceiveMemory, metrics: ProxyMetrics) -> None:
        self.memory = memory
        """What the large frames being received from clients have declared, together."""
        self._metrics = metrics
        self._waiters: collections.deque[ClientConnection] = collections.deque()
        self._logged_at = float("-inf")
        self._overdue_logged_at = float("-inf")
        self._overdue_unlogged = 0

    def wait(self, client: ClientConnection, size: int | None) -> None:
        """`client` stopped reading until its large frame can reserve receive memory."""
        if client not in self._waiters:
            self._waiters.append(client)
        self.memory.queued = len(self._waiters)
        self._metrics.receive_waits.inc()
        now = time.monotonic()
        if now - self._logged_at >= LOG_INTERVAL_S:
            self._logged_at = now
            log.warning(
                "client %s waits to send a %d-byte request: the requests being received hold "
                "%d of %d bytes (limits.receive_buffer_bytes); %d connections wait",
                client.peer,
                size or 0,
                self.memory.in_use,
                self.memory.limit,
                len(self._waiters),
            )

    def wake(self) -> None:
        """Let waiting connections start their frames, oldest first, while memory lasts."""
        waiters, memory = self._waiters, self.memory
        memory.serving = True
        try:
            while waiters and waiters[0].retry_receive():
                waiters.popleft()
        finally:
            memory.serving = False
            memory.queued = len(waiters)

    def close_overdue(
        self, client: ClientConnection, clock: FrameClock, decoder: FrameDecoder
    ) -> None:
        """Close `client`, whose reserved frame is past `clock`'s limit: its memory goes to the
        waiters. A warning at once, then at most once per `LOG_INTERVAL_S` with the count of
        such closes since; every close is counted under `frame_receive_timeout`."""
        why = (
            f"client {client.peer} took more than {clock.limit_ms} ms "
            f"(limits.frame_receive_timeout_ms) to send a {decoder.pending_frame_size() or 0}-byte "
            f"request holding receive memory ({decoder.buffered} bytes in after "
            f"{clock.spent:.1f} s of reading)"
        )
        self._overdue_unlogged += 1
        now = time.monotonic()
        if now - self._overdue_logged_at >= LOG_INTERVAL_S:
            more = self._overdue_unlogged - 1
            since = f"; {more} more such connections closed since the last line" if more else ""
            log.warning(
                "closing connection: %s; %d connections wait for receive memory%s",
                why,
                len(self._waiters),
                since,
            )
            self._overdue_logged_at = now
            self._overdue_unlogged = 0
        client.abort(why, logging.DEBUG, reason=CloseReason.FRAME_RECEIVE_TIMEOUT)
