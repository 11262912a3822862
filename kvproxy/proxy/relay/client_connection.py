"""The client side of a connection: bytes in, frames out, answers back in request order.

Transport and protocol are split as in uvicorn: `ClientConnection` (here) and its
`UpstreamConnection` (`kvproxy.proxy.relay.upstream_connection`) are `asyncio.Protocol`s that move
bytes and apply backpressure; `protocol/` does the decoding. A Produce request is handled by its
own `ProduceExchange` (`kvproxy.proxy.produce.exchange`), from decision to merged answer.
Each client connection keeps a FIFO of slots (`kvproxy.proxy.relay.response_slots`), one per
request that expects
an answer; slots leave strictly in request order. A connection is handed a `ConnectionState`, the
few shared parts of the relay it uses, never the server itself.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, cast

from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.framing import Frame, FrameDecoder, pack_size
from kvproxy.protocol.messages import API_VERSIONS, PRODUCE, supported_versions
from kvproxy.protocol.request_view import RequestView
from kvproxy.proxy.cluster.rewrite import unsupported_api_versions_answer
from kvproxy.proxy.errors import ProxyError
from kvproxy.proxy.ops.fds import OutOfFileDescriptors
from kvproxy.proxy.ops.log_limits import LineLimit
from kvproxy.proxy.ops.metrics import api_name
from kvproxy.proxy.produce.exchange import ProduceExchange
from kvproxy.proxy.relay.client_reading import ClientReading
from kvproxy.proxy.relay.close_reasons import CloseReason, PauseReason
from kvproxy.proxy.relay.connection_state import ConnectionState, arrival, listener_words
from kvproxy.proxy.relay.produce_side import ProduceSide, forward_accepted
from kvproxy.proxy.relay.response_slots import Slot

if TYPE_CHECKING:
    from kvproxy.proxy.relay.upstream_connection import UpstreamConnection

log = logging.getLogger("kvproxy")
_closing_lines = {
    reason: LineLimit(f"closing connection ({reason or 'unlabelled'})", log)
    for reason in (None, *CloseReason)
}
"""The "closing connection" lines, limited per reason: a flood of one kind of close (thousands
of clients while the broker is down) does not hide the others."""

_API_VERSIONS_MAX = max(supported_versions(API_VERSIONS))
_PRODUCE_KEY = PRODUCE.to_bytes(2, "big")


class ClientConnection(asyncio.BufferedProtocol):
    """One client connection: requests read and dispatched, answers sent back in request order.

    A buffered protocol: the transport reads into the frame decoder's buffers, and a request
    that passes its checks goes upstream as those very bytes.
    """

    def __init__(self, state: ConnectionState, node_id: int | None) -> None:
        self.state = state
        self.node_id = node_id
        """The node it serves: None for the bootstrap (SNI listener: as its handshake chose)."""
        self.listener = "bootstrap" if node_id is None else "broker"  # or "sni": `arrival`
        self.metrics = state.metrics
        self._bytes_in = self.metrics.child(self.metrics.bytes, "client_in")
        self._bytes_out = self.metrics.child(self.metrics.bytes, "client_out")
        limits = state.limits
        self._max_in_flight = limits.max_in_flight_requests
        self.buffer_pool = state.buffer_pool
        self._decoder = FrameDecoder(limits.max_frame_bytes, self.buffer_pool, state.receive.memory)
        self._slots: collections.deque[Slot] = collections.deque()
        self._pending: list[tuple[Slot, Frame]] = []
        """Requests accepted before the upstream connection is open, with their slots."""
        self.held: collections.deque[Frame] | None = None
        """Requests read while a Produce request is decided in a task (None: none is), kept by
        the exchange's `ProduceSide` (one per exchange: no cycle outlives the request)."""
        self._connect_task: asyncio.Task[Any] | None = None
        self._reading = ClientReading(self._decoder, limits.frame_receive_timeout_ms)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.transport: asyncio.Transport | None = None
        self.upstream: UpstreamConnection | None = None
        self.peer = "?"
        self.client_host = "?"
        self._closing = False

    # ---- the client's transport ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        peer = self.transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.client_host = str(peer[0]) if peer else "?"
        self.listener, self.node_id = arrival(self.transport, self.listener, self.node_id)
        if not self.state.connections.connection_opened(self):
            self._closing = True  # over a connection limit: nothing opened upstream
            self.transport.close()
            return
        self.transport.set_write_buffer_limits(high=self.state.limits.write_buffer_high_bytes)
        self._reading.started(self.transport, asyncio.get_running_loop().time())
        self.pause_reading(PauseReason.CONNECTING)
        self._connect_task = self.spawn(self._connect_upstream())

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._bytes_in.pending += nbytes  # a tally (ops/metric_tallies.py): never negative
        self._reading.received += nbytes  # the timeouts' only per-read cost: the sweep reads it
        self._decoder.buffer_updated(nbytes)
        upstream = self.upstream
        if upstream is not None:
            upstream.open_batch()  # the requests of this read go upstream in one write
        try:
            while (payload := self._decoder.next_frame()) is not None:
                held = self.held
                if held is not None:
                    held.append(payload)
                else:
                    self.on_request(payload)
        except ProtocolError as exc:
            self.abort_undecodable(exc)
        finally:
            if upstream is not None:
                upstream.write_batch()
        if self._decoder.waiting is not None and not self._closing:
            self.pause_reading(PauseReason.MEMORY)  # a large frame waits for receive memory
            self.state.receive.wait(self, self._decoder.waiting)
        elif self._reading.paused_for:
            self._reading.enforce()
        self.state.receive.wake()
        slots = self._slots
        if slots and slots[0].payload is not None:  # answers ready (most wait for the broker)
            self.flush()

    def retry_receive(self) -> bool:
        """Try again to start the large frame that waited for receive memory; True once it has
        (reading resumes) or the connection is closing."""
        return self._closing or self._reading.retry_frame()

    def pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._decoder.release()
        self.state.receive.wake()
        for task in list(self._tasks):
            if task is self._connect_task and self._pending:
                continue  # requests already accepted (acks=0 ones, say) still reach the broker
            task.cancel()
        if self.upstream is not None:
            self.upstream.close()  # after what is buffered has been written
        self.state.connections.connection_closed(self)

    # ---- requests ----

    def on_request(self, payload: Frame) -> None:
        """Answer, decide or forward one request. A Produce request goes first to the compiled
        fast accept (accepted whole: forwarded as it is, nothing read in Python); one it is not
        sure of to its exchange, which reads it through the view made here."""
        if payload[:2] == _PRODUCE_KEY:  # the compiled fast accept first (too short: not sure)
            engine = self.state.decisions.engine
            started = time.perf_counter()
            accepted = engine.accept_compiled(payload)  # None: not sure, the policies decide
            if accepted is not None:
                forward_accepted(self, accepted, payload, started)
                return
        view = RequestView(payload)
        api_key, correlation_id = view.api_key, view.correlation_id
        if api_key == API_VERSIONS and view.api_version > _API_VERSIONS_MAX:
            slot = Slot(correlation_id, api_key, 0)
            slot.payload = unsupported_api_versions_answer(correlation_id)
            self.metrics.requests.labels(api_name(api_key), "answered_locally").inc()
            self.answer_locally(slot)
            return
        if api_key == PRODUCE:
            ProduceExchange(self.state.decisions.engine).start(ProduceSide(self), view)
            return
        self.metrics.child(self.metrics.requests, api_name(api_key), "forwarded").inc()
        self.forward(Slot(correlation_id, api_key, view.api_version), payload)

    def forward(self, slot: Slot, payload: Frame) -> None:
        """Send a request upstream; `slot` waits in line for its answer."""
        self._slots.append(slot)
        if len(self._slots) >= self._max_in_flight:
            self.pause_reading(PauseReason.IN_FLIGHT)
        self.send_upstream(slot, payload)

    def answer_locally(self, slot: Slot) -> None:
        """Queue an answer the proxy made itself (`slot.payload`), in line with the others."""
        self._slots.append(slot)
        self.flush()

    def send_upstream(self, slot: Slot, payload: Frame) -> None:
        """Send a request upstream (kept until the upstream connection is open)."""
        if self.upstream is None:
            self._pending.append((slot, payload))
        else:
            self.upstream.send(slot, payload)

    # ---- answers ----

    def flush(self) -> None:
        """Send the answers that are ready, in request order, in one write."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        slots = self._slots
        if not slots or slots[0].payload is None:
            return
        tap = self.state.tap
        parts: list[Frame] = []
        sent = 0
        while slots and (payload := slots[0].payload) is not None:
            slot = slots.popleft()
            parts += (pack_size(len(payload)), payload)
            sent += len(payload) + 4
            if tap is not None:
                tap(slot.api_key, slot.api_version, bytes(payload))
        transport.writelines(parts)
        self._bytes_out.pending += sent
        if PauseReason.IN_FLIGHT in self._reading.paused_for and len(slots) < self._max_in_flight:
            self.resume_reading(PauseReason.IN_FLIGHT)

    # ---- upstream lifecycle ----

    async def _connect_upstream(self) -> None:
        try:
            upstream = await self.state.connections.open_upstream(self, self.node_id)
        except OutOfFileDescriptors as exc:  # logged by the listeners, a line per 10 s at most
            why = f"no upstream for client {self.peer}: {exc}"
            self.abort(why, logging.DEBUG, reason=CloseReason.OUT_OF_FILE_DESCRIPTORS)
            return
        except (OSError, ProxyError, TimeoutError) as exc:
            self.abort(f"no upstream for client {self.peer}: {exc}", reason=CloseReason.NO_UPSTREAM)
            return
        for slot, payload in self._pending:
            upstream.send(slot, payload)
        self._pending.clear()
        if self._closing:
            upstream.close()
            return
        self.upstream = upstream
        self.resume_reading(PauseReason.CONNECTING)

    def on_upstream_lost(self, exc: Exception | None) -> None:
        self.state.connections.upstream_closed()
        if not self._closing:
            reason = f": {exc}" if exc else ""
            self.abort(
                f"upstream closed the connection of client {self.peer}{reason}",
                reason=CloseReason.UPSTREAM_CLOSED,
            )

    # ---- reading and timeouts ----

    def check_timeouts(self, now: float, idle_after: float, stall_after: float) -> None:
        """Close the connection if it has been idle, or stalled inside a frame, for too long.
        Called by the listeners' sweep, never per read."""
        if not self._closing:
            self._reading.check(self, now, idle_after, stall_after)

    @property
    def in_flight(self) -> int:
        return len(self._slots)

    def pause_reading(self, reason: PauseReason) -> None:
        self._reading.pause(reason)

    def resume_reading(self, reason: PauseReason) -> None:
        self._reading.resume(reason)

    # ---- closing and tasks ----

    def abort(
        self, why: str, level: int = logging.WARNING, *, reason: CloseReason | None = None
    ) -> None:
        """Close both sides; `reason` (a bounded label) counts the close in the metrics."""
        if self._closing:
            return
        words = listener_words(self)
        _closing_lines[reason].log(level, "closing connection: %s (on %s)", why, words)
        if reason is not None:
            self.metrics.closed.labels(reason).inc()
        self._closing = True
        if self.transport is not None:
            self.transport.close()
        if self.upstream is not None:
            self.upstream.close()  # requests accepted before the close still reach the broker

    def abort_undecodable(self, exc: ProtocolError) -> None:
        self.abort(
            f"client {self.peer} sent an undecodable frame: {exc}", reason=CloseReason.MALFORMED
        )

    def close(self) -> None:
        self.abort("proxy shutting down", logging.DEBUG)

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `coroutine` as this connection's task: counted, cancelled when it closes."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        self.state.tasks.started()
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self.state.tasks.finished()
        if not task.cancelled() and task.exception() is not None:
            self.abort(f"internal error: {task.exception()!r}", reason=CloseReason.INTERNAL_ERROR)
