"""Client and upstream connections: bytes in, frames out, answers back in request order.

Transport and protocol are split as in uvicorn: `ClientConnection` (here) and its
`UpstreamConnection` (`kvproxy.proxy.upstream_connection`) are `asyncio.Protocol`s that only move
bytes
and apply backpressure; `protocol/` does the decoding.
Each client connection keeps a FIFO of slots (`kvproxy.proxy.slots`), one per request that expects
an
answer; slots leave strictly in request order. A connection is handed a `ConnectionState`, the
few shared parts of the relay it uses, never the server itself.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
import time
from typing import TYPE_CHECKING, Any, cast

from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.framing import Frame, FrameDecoder, size_prefix
from kvproxy.protocol.headers import RequestHeader, read_request_prefix
from kvproxy.protocol.messages import (
    API_VERSIONS,
    PRODUCE,
    Request,
    decode_request,
    supported_versions,
)
from kvproxy.proxy.errors import ProxyError
from kvproxy.proxy.fds import OutOfFileDescriptors
from kvproxy.proxy.metrics import api_name
from kvproxy.proxy.partition_limit import decide_unread, names_many_partitions
from kvproxy.proxy.produce import DECODE_BUDGET, ProduceDecision, ProduceEngine
from kvproxy.proxy.reasons import CloseReason, PauseReason
from kvproxy.proxy.receive_memory import FrameClock
from kvproxy.proxy.relay_state import ConnectionState
from kvproxy.proxy.rewrite import (
    REWRITE_INLINE_BYTES,
    needs_rewrite,
    rewrite_off_loop,
    rewrite_response,
    unsupported_api_versions_answer,
)
from kvproxy.proxy.slots import MAX_SILENT_SLOTS, Slot, answers_silent, merged

if TYPE_CHECKING:
    from kvproxy.proxy.upstream_connection import UpstreamConnection

log = logging.getLogger("kvproxy")

_CORRELATION = struct.Struct(">i")
_API_VERSIONS_MAX = max(supported_versions(API_VERSIONS))


class ClientConnection(asyncio.BufferedProtocol):
    """One client connection and its upstream: requests out in order, answers back in order.

    A buffered protocol: the transport reads into the frame decoder's buffers, and a request
    that passes its checks goes upstream as those very bytes.
    """

    def __init__(self, state: ConnectionState, node_id: int | None) -> None:
        self._state = state
        self.node_id = node_id
        """The listener this connection came through: None for bootstrap, else the node id."""
        self.metrics = state.metrics
        self._bytes_in = self.metrics.bytes.labels("client_in")
        self._bytes_out = self.metrics.bytes.labels("client_out")
        self._bytes_upstream = self.metrics.bytes.labels("upstream_out")
        limits = state.limits
        self._max_in_flight = limits.max_in_flight_requests
        self.buffer_pool = state.buffer_pool
        self._decoder = FrameDecoder(limits.max_frame_bytes, self.buffer_pool, state.receive.memory)
        self._slots: collections.deque[Slot] = collections.deque()
        self._awaiting_upstream: collections.deque[Slot] = collections.deque()
        self._pending_frames: list[Frame] = []
        self._held: collections.deque[Frame] | None = None
        self._outgoing: list[Frame] | None = None
        """While a read is being handled: what goes upstream when it is done (one write)."""
        self._connect_task: asyncio.Task[Any] | None = None
        self._paused_for: set[PauseReason] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.transport: asyncio.Transport | None = None
        self.upstream: UpstreamConnection | None = None
        self.peer = "?"
        self.client_host = "?"
        self._closing = False
        self._received = 0
        """Bytes read from the client; the timeout sweep compares it with what it saw last."""
        self._seen_received = 0
        self._quiet_since = 0.0
        """When the sweep last saw bytes arrive (or reading paused by the proxy itself)."""
        self._idle_since = 0.0
        """As `_quiet_since`, and also moved on while a request is in flight."""
        self._frame_clock = FrameClock(limits.frame_receive_timeout_ms)

    # ---- client side ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        peer = self.transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.client_host = str(peer[0]) if peer else "?"
        if not self._state.connections.connection_opened(self):
            self._closing = True  # over a connection limit: nothing opened upstream
            self.transport.close()
            return
        self.transport.set_write_buffer_limits(high=self._state.limits.write_buffer_high_bytes)
        self._quiet_since = self._idle_since = asyncio.get_running_loop().time()
        self.pause_reading(PauseReason.CONNECTING)
        self._connect_task = self._spawn(self._connect_upstream())

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._bytes_in.inc(nbytes)
        self._received += nbytes  # the timeouts' only per-read cost: the sweep reads it
        self._decoder.buffer_updated(nbytes)
        self._outgoing = []  # the requests of this read go upstream in one write
        try:
            while (payload := self._decoder.next_frame()) is not None:
                if self._held is not None:
                    self._held.append(payload)
                else:
                    self._on_request(payload)
        except ProtocolError as exc:
            self.abort(
                f"client {self.peer} sent an undecodable frame: {exc}", reason=CloseReason.MALFORMED
            )
        finally:
            outgoing, self._outgoing = self._outgoing, None
            if outgoing and self.upstream is not None and self.upstream.transport is not None:
                self.upstream.transport.writelines(outgoing)
        if self._decoder.waiting is not None and not self._closing:
            self.pause_reading(PauseReason.MEMORY)  # a large frame waits for receive memory
            self._state.receive.wait(self, self._decoder.waiting)
        elif self._paused_for:
            self._enforce_pause()
        self._state.receive.wake()
        self.flush()

    def retry_receive(self) -> bool:
        """Try again to start the large frame that waited for receive memory; True once it has
        (reading resumes) or the connection is closing."""
        if self._closing:
            return True
        try:
            self._decoder.next_frame()  # cannot complete: only reserves and starts its buffer
        except ProtocolError:  # checked when its prefix came; kept for safety
            return True
        if self._decoder.waiting is not None:
            return False
        self.resume_reading(PauseReason.MEMORY)
        return True

    def pause_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._decoder.release()
        self._state.receive.wake()
        for task in list(self._tasks):
            if task is self._connect_task and self._pending_frames:
                continue  # requests already accepted (acks=0 ones, say) still reach the broker
            task.cancel()
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()  # after what is buffered has been written
        self._state.connections.connection_closed(self)

    # ---- requests ----

    def _on_request(self, payload: Frame) -> None:
        (api_key, api_version, correlation_id), _ = read_request_prefix(payload)
        if api_key == API_VERSIONS and api_version > _API_VERSIONS_MAX:
            slot = Slot(correlation_id, api_key, 0)
            slot.payload = unsupported_api_versions_answer(correlation_id)
            self.metrics.requests.labels(api_name(api_key), "answered_locally").inc()
            self._slots.append(slot)
            self.flush()
            return
        if api_key == PRODUCE:
            self._on_produce(self._state.decisions.engine, payload)
            return
        self.metrics.child(self.metrics.requests, api_name(api_key), "forwarded").inc()
        slot = Slot(correlation_id, api_key, api_version)
        self._slots.append(slot)
        self._awaiting_upstream.append(slot)
        if len(self._slots) >= self._max_in_flight:
            self.pause_reading(PauseReason.IN_FLIGHT)
        self._send_upstream(payload)

    # ---- produce requests: the policies decide ----

    def _on_produce(self, engine: ProduceEngine, payload: Frame) -> None:
        """Decide on the loop when that is cheap; otherwise hold this connection's later
        requests (their answers must follow this one's) and decide in a task."""
        started = time.perf_counter()
        request: Request | None = None
        unknown: list[str] = []
        if not names_many_partitions(payload, engine.settings.inline_max_partitions):
            request = decode_request(payload)  # malformed: DecodeError ends the connection
            unknown = self._state.decisions.topics_to_describe(request, self)
        if request is not None and not unknown:
            decision = self._state.decisions.decide_inline(engine, payload, request)
            if decision is not None:
                self._apply_produce(request.header, decision, started)
                return
        self._held = collections.deque()
        self.pause_reading(PauseReason.PRODUCE)
        self._spawn(self._decide_later(engine, payload, request, unknown, started))

    async def _decide_later(
        self,
        engine: ProduceEngine,
        payload: Frame,
        request: Request | None,
        topics: list[str],
        started: float,
    ) -> None:
        """Describe the topics and look up the schema ids the checks need, then decide (on the
        loop if it is cheap, else on the decoding thread); then handle the requests held
        meanwhile, in order."""
        try:
            if (
                request is None
            ):  # many partitions: read off the loop too (`kvproxy.proxy.partition_limit`)
                header, decision = await decide_unread(self._state.decisions, engine, payload, self)
            else:
                header = request.header
                decisions = self._state.decisions
                decision = await decisions.decide_later(engine, payload, request, topics)
        except ProtocolError as exc:
            self.abort(
                f"client {self.peer} sent an undecodable frame: {exc}", reason=CloseReason.MALFORMED
            )
            return
        held, self._held = self._held, None
        try:
            self._apply_produce(header, decision, started)
            while held and self._held is None:
                self._on_request(held.popleft())
        except ProtocolError as exc:
            self.abort(
                f"client {self.peer} sent an undecodable frame: {exc}", reason=CloseReason.MALFORMED
            )
            return
        if held and self._held is not None:
            self._held.extendleft(reversed(held))  # blocked again: keep the order
        if self._held is None:
            self.resume_reading(PauseReason.PRODUCE)
            self.flush()

    def _apply_produce(
        self, header: RequestHeader, decision: ProduceDecision, started: float
    ) -> None:
        self._state.sink.record(decision, header.client_id, self.peer)
        outcome = "forwarded"
        if decision.rejected:
            outcome = "rejected" if decision.forward is None else "partially_rejected"
            refused = sum(1 for o in decision.rejected if o.verdict.policy == DECODE_BUDGET)
            if refused:
                self.metrics.decode_budget_refusals.inc(refused)
        self.metrics.child(self.metrics.requests, "produce", outcome).inc()
        try:
            self._route_produce(decision, header.correlation_id, header.api_version)
        finally:
            self.metrics.proxy_latency.observe(time.perf_counter() - started)

    def _route_produce(self, decision: ProduceDecision, correlation_id: int, version: int) -> None:
        if decision.acks == 0:
            if decision.forward is not None:
                awaiting = self._awaiting_upstream
                if len(awaiting) >= MAX_SILENT_SLOTS and awaiting[0].silent:
                    awaiting.popleft()
                awaiting.append(Slot(correlation_id, PRODUCE, version, silent=True))
                self._send_upstream(decision.forward)
            if decision.rejected:
                self.abort(
                    f"acks=0 produce request from {self.peer} rejected: closing the connection "
                    "as a broker does",
                    reason=CloseReason.ACKS0_REJECTION,
                )
            return
        slot = Slot(correlation_id, PRODUCE, version)
        slot.decision = decision
        self._slots.append(slot)
        if decision.forward is None:
            slot.payload = decision.answer(None)
            self.flush()
            return
        self._awaiting_upstream.append(slot)
        if len(self._slots) >= self._max_in_flight:
            self.pause_reading(PauseReason.IN_FLIGHT)
        slot.sent_at = time.perf_counter()
        self._send_upstream(decision.forward)

    def _send_upstream(self, payload: Frame) -> None:
        if self.upstream is None or self.upstream.transport is None:
            self._pending_frames.append(payload)
            return
        if self._outgoing is not None:
            self._outgoing += (size_prefix(payload), payload)
        else:
            self.upstream.transport.writelines((size_prefix(payload), payload))
        self._bytes_upstream.inc(len(payload) + 4)

    # ---- answers ----

    def on_upstream_frame(self, payload: Frame) -> None:
        correlation_id = _CORRELATION.unpack_from(payload)[0] if len(payload) >= 4 else None
        while self._awaiting_upstream and self._awaiting_upstream[0].silent:
            silent = self._awaiting_upstream.popleft()
            if silent.correlation_id != correlation_id:
                continue
            owner = answers_silent(self._awaiting_upstream, silent, payload)
            if owner is None:
                self.abort(
                    f"answer with correlation id {correlation_id} could be the acks=0 request's "
                    "or a later one's: closing rather than guessing",
                    reason=CloseReason.UPSTREAM_ERROR,
                )
                return
            if owner:
                return  # the broker answered an acks=0 request: the client expects nothing
        if not self._awaiting_upstream:
            self.abort(
                "upstream sent an answer nobody asked for", reason=CloseReason.UPSTREAM_ERROR
            )
            return
        slot = self._awaiting_upstream.popleft()
        if slot.sent_at:
            self.metrics.upstream_latency.observe(time.perf_counter() - slot.sent_at)
        if len(payload) < 4 or _CORRELATION.unpack_from(payload)[0] != slot.correlation_id:
            self.abort(
                f"upstream answered out of order (expected {slot.correlation_id})",
                reason=CloseReason.UPSTREAM_ERROR,
            )
            return
        if needs_rewrite(slot.api_key, slot.api_version):
            if len(payload) > REWRITE_INLINE_BYTES:  # rewritten off the loop, answered in order
                self._spawn(self._learn_then_answer(slot, payload, None))
                return
            nodes = self._state.nodes
            try:
                payload, learned = rewrite_response(
                    payload,
                    slot.api_key,
                    slot.api_version,
                    nodes.public_host,
                    nodes.port_or_none,
                    topics_seen=self.metrics.topic_labels.seen,
                )
            except (ProtocolError, ProxyError) as exc:
                self.abort(
                    f"cannot rewrite the answer to api {slot.api_key} v{slot.api_version}: {exc}",
                    reason=CloseReason.UPSTREAM_ERROR,
                )
                return
            if not nodes.knows_nodes(learned):  # a listener to open first: the answer waits
                self._spawn(self._learn_then_answer(slot, payload, learned))
                return
        self._answer(slot, payload)
        # the caller flushes once the read is done

    def _answer(self, slot: Slot, payload: Frame) -> None:
        try:
            slot.payload = merged(slot, payload)
        except ProtocolError as exc:
            self.abort(
                f"cannot merge the broker's produce answer: {exc}",
                reason=CloseReason.UPSTREAM_ERROR,
            )

    async def _learn_then_answer(
        self, slot: Slot, payload: Frame, learned: dict[int, tuple[str, int]] | None
    ) -> None:
        nodes = self._state.nodes
        if learned is None:  # a large answer, not rewritten yet
            try:
                payload, learned = await rewrite_off_loop(
                    payload,
                    slot.api_key,
                    slot.api_version,
                    nodes.public_host,
                    nodes.port_or_none,
                    topics_seen=self.metrics.topic_labels.seen,
                    off_loop=self._state.decisions.off_loop,
                )
            except (ProtocolError, ProxyError) as exc:
                why = f"cannot rewrite the answer to api {slot.api_key} v{slot.api_version}: {exc}"
                self.abort(why, reason=CloseReason.UPSTREAM_ERROR)
                return
        for node_id, address in learned.items():
            await nodes.learn_node_or_log(node_id, address)
        self._answer(slot, payload)  # a node whose port is taken: its clients retry elsewhere
        self.flush()

    def flush(self) -> None:
        """Send the answers that are ready, in request order, in one write."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        slots = self._slots
        if not slots or slots[0].payload is None:
            return
        tap = self._state.tap
        parts: list[Frame] = []
        sent = 0
        while slots and (payload := slots[0].payload) is not None:
            slot = slots.popleft()
            parts += (size_prefix(payload), payload)
            sent += len(payload) + 4
            if tap is not None:
                tap(slot.api_key, slot.api_version, bytes(payload))
        transport.writelines(parts)
        self._bytes_out.inc(sent)
        if len(slots) < self._max_in_flight:
            self.resume_reading(PauseReason.IN_FLIGHT)

    # ---- upstream lifecycle ----

    async def _connect_upstream(self) -> None:
        try:
            upstream = await self._state.connections.open_upstream(self, self.node_id)
        except OutOfFileDescriptors as exc:  # logged by the listeners, a line per 10 s at most
            why = f"no upstream for client {self.peer}: {exc}"
            self.abort(why, logging.DEBUG, reason=CloseReason.OUT_OF_FILE_DESCRIPTORS)
            return
        except (OSError, ProxyError, TimeoutError) as exc:
            self.abort(f"no upstream for client {self.peer}: {exc}", reason=CloseReason.NO_UPSTREAM)
            return
        if self._closing:
            if upstream.transport is not None:
                for payload in self._pending_frames:
                    upstream.transport.writelines((size_prefix(payload), payload))
                self._pending_frames.clear()
                upstream.transport.close()
            return
        self.upstream = upstream
        for payload in self._pending_frames:
            self._send_upstream(payload)
        self._pending_frames.clear()
        self.resume_reading(PauseReason.CONNECTING)

    def on_upstream_lost(self, exc: Exception | None) -> None:
        self._state.connections.upstream_closed()
        if not self._closing:
            reason = f": {exc}" if exc else ""
            self.abort(
                f"upstream closed the connection of client {self.peer}{reason}",
                reason=CloseReason.UPSTREAM_CLOSED,
            )

    # ---- timeouts ----

    def check_timeouts(self, now: float, idle_after: float, stall_after: float) -> None:
        """Close the connection if it has been idle, or stalled inside a frame, for too long.

        Called by the listeners' sweep, never per read: a read only adds to `_received`, and the
        sweep notices the change. Time during which the proxy itself does not read (backpressure,
        connecting upstream, waiting for topic configs) counts as activity, not as a stall.
        """
        if self._closing:
            return
        if self._frame_clock.overdue(now, self._decoder, self._paused_for):
            self._state.receive.close_overdue(self, self._frame_clock, self._decoder)
            return
        received = self._received
        if received != self._seen_received or self._paused_for:
            self._seen_received = received
            self._quiet_since = self._idle_since = now
            return
        if self._slots:
            self._idle_since = now
        if self._decoder.buffered:
            if now - self._quiet_since >= stall_after:
                self.abort(
                    f"client {self.peer} sent part of a request and nothing more for "
                    f"{now - self._quiet_since:.1f} s",
                    logging.INFO,
                    reason=CloseReason.SLOW_REQUEST,
                )
        elif now - self._idle_since >= idle_after:
            self.abort(
                f"client {self.peer} idle for {now - self._idle_since:.1f} s",
                logging.DEBUG,
                reason=CloseReason.IDLE,
            )

    # ---- helpers ----

    @property
    def in_flight(self) -> int:
        return len(self._slots)

    def pause_reading(self, reason: PauseReason) -> None:
        self._paused_for.add(reason)
        self._enforce_pause()

    def _enforce_pause(self) -> None:
        """Stop the transport reading while any reason holds. Checked again after each read:
        uvloop starts reading after `connection_made` returns, whatever was asked in it."""
        transport = self.transport
        if transport is not None and not transport.is_closing() and transport.is_reading():
            transport.pause_reading()

    def resume_reading(self, reason: PauseReason) -> None:
        if reason not in self._paused_for:
            return
        self._paused_for.discard(reason)
        transport = self.transport
        if (
            not self._paused_for
            and transport is not None
            and not transport.is_closing()
            and not transport.is_reading()
        ):
            transport.resume_reading()

    def abort(
        self, why: str, level: int = logging.WARNING, *, reason: CloseReason | None = None
    ) -> None:
        """Close both sides; `reason` (a bounded label) counts the close in the metrics."""
        if self._closing:
            return
        log.log(level, "closing connection: %s", why)
        if reason is not None:
            self.metrics.closed.labels(reason).inc()
        self._closing = True
        if self.transport is not None:
            self.transport.close()
        if self.upstream is not None and self.upstream.transport is not None:
            outgoing, self._outgoing = self._outgoing, None
            if outgoing:  # requests accepted before the close still reach the broker
                self.upstream.transport.writelines(outgoing)
            self.upstream.transport.close()

    def close(self) -> None:
        self.abort("proxy shutting down", logging.DEBUG)

    def _spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        self._state.tasks.started()
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._state.tasks.finished()
        if not task.cancelled() and task.exception() is not None:
            self.abort(f"internal error: {task.exception()!r}", reason=CloseReason.INTERNAL_ERROR)
