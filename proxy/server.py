"""The relay: listeners, one upstream connection per client connection, ordered answers.

Transport and protocol are split as in uvicorn: `ClientConnection` and `UpstreamConnection` are
`asyncio.Protocol`s that only move bytes and apply backpressure; `protocol/` does the decoding.
Each client connection keeps a FIFO of slots, one per request that expects an answer; an answer
(from the broker, rewritten or not, or made by the proxy itself) fills its slot, and slots leave
strictly in request order. acks=0 Produce requests get no slot, as a broker sends no answer.

Port-per-broker: the bootstrap listener (`listen.port`) forwards to any live bootstrap server; the
listener for upstream node N is `listen.broker_port_base + N mod listen.max_brokers` (or
`+ N - listen.lowest_node_id` when that is set), opened the first time an answer names node N.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import ssl
import struct
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from policies.config import PolicyConfigError, TopicRouting, build_routing
from policies.topic_patterns import any_of
from protocol.budget import Allowance, InlineLimitReached, MemoryBudget, OutOfMemory
from protocol.error_codes import ErrorProfile
from protocol.errors import ProtocolError, UnsupportedVersion
from protocol.framing import BufferPool, Frame, FrameDecoder, size_prefix
from protocol.headers import read_request_prefix
from protocol.messages import (
    API_VERSIONS,
    PRODUCE,
    Request,
    decode_request,
    decode_response,
    supported_versions,
)
from protocol.produce import read_produce_acks
from proxy.bounds import MAX_TOPIC_CHARS, clip
from proxy.config import NodePortError, ProxyConfig, shared_port_problem
from proxy.dead_letter import dead_letter_records, send_dead_letter
from proxy.fds import FdExhaustion, OutOfFileDescriptors, out_of_fds
from proxy.fds import describe as describe_fd_shortage
from proxy.logs import RejectionEvent, RejectionLogger
from proxy.memory import return_large_buffers_to_the_os
from proxy.metrics import ProxyMetrics, api_name, start_http_endpoint
from proxy.produce import (
    DECODE_BUDGET,
    PartitionOutcome,
    ProduceDecision,
    ProduceEngine,
    ProduceSettings,
)
from proxy.quarantine import WORKER_DIR_PREFIX, Journal, QuarantineEntry
from proxy.rewrite import needs_rewrite, rewrite_response, unsupported_api_versions_answer
from proxy.topic_configs import TopicConfigCache
from proxy.upstream_client import describe_failure, topics_exist

log = logging.getLogger("kvproxy")

_CORRELATION = struct.Struct(">i")
_API_VERSIONS_MAX = max(supported_versions(API_VERSIONS))
READINESS_INTERVAL_S = 5.0
METADATA_RETRY_S = 1.0
"""Until the cluster first answers Metadata, how often the proxy asks again."""
REFUSAL_LOG_INTERVAL_S = 10.0
"""Refused connections are logged at most once per interval, with a count of the rest."""
_SWEEP_MIN_S = 0.01
_SWEEP_MAX_S = 5.0
_MAX_UNMAPPED_LOGGED = 1_000
"""Node ids remembered (and logged) as having no port or no listener; beyond, silence."""
INLINE_DECODE_BYTES = 4 * 1024 * 1024
"""Decoding memory a Produce request may use on the event loop (a few milliseconds of work);
one that needs more is decided again on the decoding thread."""
DECODING_SWITCH_INTERVAL_S = 0.0005
LAG_TICK_S = 0.1
LAG_WINDOW_S = 60.0
MAX_REJECTION_KEYS = 1_000
"""(topic, policy, code) keys `ProxyServer.rejections` keeps (the oldest is dropped first)."""
_MAX_SILENT = 10_000
"""acks=0 requests remembered in case the broker answers them (Tansu does, Kafka does not)."""


T = TypeVar("T")

ResponseTap = Callable[[int, int, bytes], None]
"""Sees every answer as it leaves for a client: (api key, api version, frame). For tracing."""


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """This process is worker `index` of `kvproxy serve --workers N` (see proxy/workers.py).

    Its listeners share their ports with the other workers (SO_REUSEPORT), its quarantine journal
    is `<quarantine.dir>/worker-<index>` (a journal has one writer), and its metrics endpoint
    listens on a loopback port of its own, written to `<state_dir>/worker-<index>.port`, where
    the supervisor reads it to serve every worker's metrics on the configured port.
    """

    index: int
    state_dir: Path

    @property
    def port_file(self) -> Path:
        return self.state_dir / f"worker-{self.index}.port"

    def announce(self, metrics_port: int | None) -> None:
        """Tell the supervisor this worker serves (and handles SIGHUP): write the port file."""
        staged = self.port_file.with_suffix(".tmp")
        staged.write_text("" if metrics_port is None else str(metrics_port))
        staged.replace(self.port_file)


class ProxyError(Exception):
    """The proxy cannot do what the configuration asks (e.g. a node id outside the port range)."""


@dataclass(frozen=True, slots=True)
class ProxyStats:
    client_connections: int
    upstream_connections: int
    listeners: int
    pending_tasks: int


class _Slot:
    """One request waiting for its answer; `payload` is the answer frame once known."""

    __slots__ = (
        "api_key",
        "api_version",
        "correlation_id",
        "decision",
        "payload",
        "sent_at",
        "silent",
    )

    def __init__(
        self, correlation_id: int, api_key: int, api_version: int, silent: bool = False
    ) -> None:
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.api_version = api_version
        self.payload: Frame | None = None
        self.decision: ProduceDecision | None = None
        self.sent_at = 0.0
        self.silent = silent
        """An acks=0 Produce: the client expects no answer, so one from the broker is dropped."""


class UpstreamConnection(asyncio.BufferedProtocol):
    """The broker side of one client connection: frames in, handed to the client side.

    A buffered protocol: the transport reads into the frame decoder's buffers, so a large answer
    (a Fetch) reaches the client without being copied in between.
    """

    def __init__(self, client: ClientConnection, max_frame_bytes: int) -> None:
        self._client = client
        self._bytes_in = client.metrics.bytes.labels("upstream_in")
        self._decoder = FrameDecoder(max_frame_bytes, client.buffer_pool)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._bytes_in.inc(nbytes)
        self._decoder.buffer_updated(nbytes)
        client = self._client
        try:
            while (payload := self._decoder.next_frame()) is not None:
                client.on_upstream_frame(payload)
        except ProtocolError as exc:
            client.abort(f"upstream sent an undecodable frame: {exc}")
        client.flush()  # every answer this read completed, in one write

    def pause_writing(self) -> None:
        self._client.pause_reading("upstream-full")

    def resume_writing(self) -> None:
        self._client.resume_reading("upstream-full")

    def connection_lost(self, exc: Exception | None) -> None:
        client = self._client
        client.on_upstream_lost(exc)
        # Break the client <-> upstream cycle, so a closed pair (and the frame buffers its
        # pending answers hold) is freed at once rather than by the cycle collector.
        client.upstream = None


class ClientConnection(asyncio.BufferedProtocol):
    """One client connection and its upstream: requests out in order, answers back in order.

    A buffered protocol: the transport reads into the frame decoder's buffers, and a request
    that passes its checks goes upstream as those very bytes.
    """

    def __init__(self, server: ProxyServer, node_id: int | None) -> None:
        self._server = server
        self.node_id = node_id
        """The listener this connection came through: None for bootstrap, else the node id."""
        self.metrics = server.metrics
        self._bytes_in = self.metrics.bytes.labels("client_in")
        self._bytes_out = self.metrics.bytes.labels("client_out")
        self._bytes_upstream = self.metrics.bytes.labels("upstream_out")
        limits = server.config.limits
        self._max_in_flight = limits.max_in_flight_requests
        self.buffer_pool = server.buffer_pool
        self._decoder = FrameDecoder(
            limits.max_frame_bytes, self.buffer_pool, server.receive_memory
        )
        self._slots: collections.deque[_Slot] = collections.deque()
        self._awaiting_upstream: collections.deque[_Slot] = collections.deque()
        self._pending_frames: list[Frame] = []
        self._held: collections.deque[Frame] | None = None
        self._outgoing: list[Frame] | None = None
        """While a read is being handled: what goes upstream when it is done (one write)."""
        self._connect_task: asyncio.Task[Any] | None = None
        self._paused_for: set[str] = set()
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

    # ---- client side ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        peer = self.transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.client_host = str(peer[0]) if peer else "?"
        if not self._server.connection_opened(self):
            self._closing = True  # over a connection limit: nothing opened upstream
            self.transport.close()
            return
        self.transport.set_write_buffer_limits(
            high=self._server.config.limits.write_buffer_high_bytes
        )
        self._quiet_since = self._idle_since = asyncio.get_running_loop().time()
        self.pause_reading("connecting")
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
            self.abort(f"client {self.peer} sent an undecodable frame: {exc}", reason="malformed")
        finally:
            outgoing, self._outgoing = self._outgoing, None
            if outgoing and self.upstream is not None and self.upstream.transport is not None:
                self.upstream.transport.writelines(outgoing)
        if self._decoder.waiting is not None and not self._closing:
            self.pause_reading("memory")  # a large frame waits for receive memory
            self._server.wait_for_receive_memory(self)
        elif self._paused_for:
            self._enforce_pause()
        self._server.wake_receive_waiters()
        self.flush()

    @property
    def waiting_frame(self) -> int | None:
        """The size of the large frame waiting for receive memory, if any."""
        return self._decoder.waiting

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
        self.resume_reading("memory")
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
        self._server.wake_receive_waiters()
        for task in list(self._tasks):
            if task is self._connect_task and self._pending_frames:
                continue  # requests already accepted (acks=0 ones, say) still reach the broker
            task.cancel()
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()  # after what is buffered has been written
        self._server.connection_closed(self)

    # ---- requests ----

    def _on_request(self, payload: Frame) -> None:
        (api_key, api_version, correlation_id), _ = read_request_prefix(payload)
        if api_key == API_VERSIONS and api_version > _API_VERSIONS_MAX:
            slot = _Slot(correlation_id, api_key, 0)
            slot.payload = unsupported_api_versions_answer(correlation_id)
            self.metrics.requests.labels(api_name(api_key), "answered_locally").inc()
            self._slots.append(slot)
            self.flush()
            return
        engine = self._server.produce_engine
        if api_key == PRODUCE and engine is not None:
            self._on_produce(engine, payload)
            return
        expects_answer = not (api_key == PRODUCE and read_produce_acks(payload) == 0)
        self.metrics.child(self.metrics.requests, api_name(api_key), "forwarded").inc()
        if expects_answer:
            slot = _Slot(correlation_id, api_key, api_version)
            self._slots.append(slot)
            self._awaiting_upstream.append(slot)
            if len(self._slots) >= self._max_in_flight:
                self.pause_reading("in-flight")
        else:
            awaiting = self._awaiting_upstream
            if len(awaiting) >= _MAX_SILENT and awaiting[0].silent:
                awaiting.popleft()
            awaiting.append(_Slot(correlation_id, api_key, api_version, silent=True))
        self._send_upstream(payload)

    # ---- produce requests: the policies decide ----

    def _on_produce(self, engine: ProduceEngine, payload: Frame) -> None:
        """Decide on the loop when that is cheap; otherwise hold this connection's later
        requests (their answers must follow this one's) and decide in a task."""
        started = time.perf_counter()
        request = decode_request(payload)  # malformed: DecodeError ends the connection
        unknown = self._server.topics_to_describe(request)
        if not unknown:
            decision = self._server.decide_inline(engine, payload, request)
            if decision is not None:
                self._apply_produce(request, decision, started)
                return
        self._held = collections.deque()
        self.pause_reading("produce")
        self._spawn(self._decide_later(engine, payload, request, unknown, started))

    async def _decide_later(
        self,
        engine: ProduceEngine,
        payload: Frame,
        request: Request,
        topics: list[str],
        started: float,
    ) -> None:
        """Describe the topics the checks need, then decide: on the loop if it is cheap, else
        on the decoding thread; then handle the requests held meanwhile, in order."""
        server = self._server
        try:
            if topics:
                await server.describe_topics(topics)
            decision = server.decide_inline(engine, payload, request)
            if decision is None:
                decision = await server.decide_off_loop(engine, payload, request)
        except ProtocolError as exc:
            self.abort(f"client {self.peer} sent an undecodable frame: {exc}", reason="malformed")
            return
        held, self._held = self._held, None
        try:
            self._apply_produce(request, decision, started)
            while held and self._held is None:
                self._on_request(held.popleft())
        except ProtocolError as exc:
            self.abort(f"client {self.peer} sent an undecodable frame: {exc}", reason="malformed")
            return
        if held and self._held is not None:
            self._held.extendleft(reversed(held))  # blocked again: keep the order
        if self._held is None:
            self.resume_reading("produce")
            self.flush()

    def _apply_produce(self, request: Request, decision: ProduceDecision, started: float) -> None:
        header = request.header
        server = self._server
        server.report(decision, header.client_id, self.peer)
        server.count_produced(decision)
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
                self._awaiting_upstream.append(_Slot(correlation_id, PRODUCE, version, silent=True))
                self._send_upstream(decision.forward)
            if decision.rejected:
                self.abort(
                    f"acks=0 produce request from {self.peer} rejected: closing the connection "
                    "as a broker does",
                    reason="acks0_rejection",
                )
            return
        slot = _Slot(correlation_id, PRODUCE, version)
        slot.decision = decision
        self._slots.append(slot)
        if decision.forward is None:
            slot.payload = decision.answer(None)
            self.flush()
            return
        self._awaiting_upstream.append(slot)
        if len(self._slots) >= self._max_in_flight:
            self.pause_reading("in-flight")
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
            owner = self._answers_silent(silent, payload)
            if owner is None:
                self.abort(
                    f"answer with correlation id {correlation_id} could be the acks=0 request's "
                    "or a later one's: closing rather than guessing",
                    reason="upstream_error",
                )
                return
            if owner:
                return  # the broker answered an acks=0 request: the client expects nothing
        if not self._awaiting_upstream:
            self.abort("upstream sent an answer nobody asked for", reason="upstream_error")
            return
        slot = self._awaiting_upstream.popleft()
        if slot.sent_at:
            self.metrics.upstream_latency.observe(time.perf_counter() - slot.sent_at)
        if len(payload) < 4 or _CORRELATION.unpack_from(payload)[0] != slot.correlation_id:
            self.abort(
                f"upstream answered out of order (expected {slot.correlation_id})",
                reason="upstream_error",
            )
            return
        if needs_rewrite(slot.api_key, slot.api_version):
            server = self._server
            try:
                payload, learned = rewrite_response(
                    payload,
                    slot.api_key,
                    slot.api_version,
                    server.public_host,
                    server.port_or_none,
                    topics_seen=server.metrics.topic_labels.seen,
                )
            except (ProtocolError, ProxyError) as exc:
                self.abort(
                    f"cannot rewrite the answer to api {slot.api_key} v{slot.api_version}: {exc}",
                    reason="upstream_error",
                )
                return
            if not server.knows_nodes(learned):  # a listener to open first: the answer waits
                self._spawn(self._learn_then_answer(slot, payload, learned))
                return
        self._answer(slot, payload)
        # the caller flushes once the read is done

    def _merged(self, slot: _Slot, payload: Frame) -> Frame:
        """The broker's answer, merged with the proxy's own errors when it rejected partitions,
        under the rules the request was judged by (a reload meanwhile changes neither)."""
        decision = slot.decision
        if decision is None:
            return payload
        decision.observe(payload)
        if not decision.needs_merge:
            return payload
        return decision.answer(payload)

    def _answers_silent(self, silent: _Slot, payload: Frame) -> bool | None:
        """Whether an answer carrying an acks=0 request's correlation id is that request's.

        Usually yes (Tansu answers acks=0 requests; Kafka does not). But ids need not be unique:
        when a later request awaiting its answer has the same id, the answer is the acks=0
        request's only if it decodes as its Produce answer, the later request's only if it
        decodes as that one's; None when it decodes as both (the caller closes: never guess)."""
        later = next(
            (
                slot
                for slot in self._awaiting_upstream
                if not slot.silent and slot.correlation_id == silent.correlation_id
            ),
            None,
        )
        if later is None:
            return True
        try:
            decode_response(payload, PRODUCE, silent.api_version)
        except ProtocolError:
            return False
        try:
            decode_response(payload, later.api_key, later.api_version)
        except UnsupportedVersion:
            return None  # an API the proxy relays without decoding: it cannot tell
        except ProtocolError:
            return True
        return None

    def _answer(self, slot: _Slot, payload: Frame) -> None:
        try:
            slot.payload = self._merged(slot, payload)
        except ProtocolError as exc:
            self.abort(f"cannot merge the broker's produce answer: {exc}", reason="upstream_error")

    async def _learn_then_answer(
        self, slot: _Slot, payload: Frame, learned: dict[int, tuple[str, int]]
    ) -> None:
        server = self._server
        for node_id, address in learned.items():
            await server.learn_node_or_log(node_id, address)
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
        tap = self._server.tap
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
            self.resume_reading("in-flight")

    # ---- upstream lifecycle ----

    async def _connect_upstream(self) -> None:
        try:
            upstream = await self._server.open_upstream(self, self.node_id)
        except OutOfFileDescriptors as exc:  # logged by the server, a line per 10 s at most
            why = f"no upstream for client {self.peer}: {exc}"
            self.abort(why, logging.DEBUG, reason="out_of_file_descriptors")
            return
        except (OSError, ProxyError, TimeoutError) as exc:
            self.abort(f"no upstream for client {self.peer}: {exc}", reason="no_upstream")
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
        self.resume_reading("connecting")

    def on_upstream_lost(self, exc: Exception | None) -> None:
        self._server.upstream_closed()
        if not self._closing:
            reason = f": {exc}" if exc else ""
            self.abort(
                f"upstream closed the connection of client {self.peer}{reason}",
                reason="upstream_closed",
            )

    # ---- timeouts ----

    def check_timeouts(self, now: float, idle_after: float, stall_after: float) -> None:
        """Close the connection if it has been idle, or stalled inside a frame, for too long.

        Called by the server's sweep, never per read: a read only adds to `_received`, and the
        sweep notices the change. Time during which the proxy itself does not read (backpressure,
        connecting upstream, waiting for topic configs) counts as activity, not as a stall.
        """
        if self._closing:
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
                    reason="slow_request",
                )
        elif now - self._idle_since >= idle_after:
            self.abort(
                f"client {self.peer} idle for {now - self._idle_since:.1f} s",
                logging.DEBUG,
                reason="idle",
            )

    # ---- helpers ----

    @property
    def in_flight(self) -> int:
        return len(self._slots)

    def pause_reading(self, reason: str) -> None:
        self._paused_for.add(reason)
        self._enforce_pause()

    def _enforce_pause(self) -> None:
        """Stop the transport reading while any reason holds. Checked again after each read:
        uvloop starts reading after `connection_made` returns, whatever was asked in it."""
        transport = self.transport
        if transport is not None and not transport.is_closing() and transport.is_reading():
            transport.pause_reading()

    def resume_reading(self, reason: str) -> None:
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

    def abort(self, why: str, level: int = logging.WARNING, *, reason: str | None = None) -> None:
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
        self._server.task_started()
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._server.task_finished()
        if not task.cancelled() and task.exception() is not None:
            self.abort(f"internal error: {task.exception()!r}", reason="internal_error")


class ProxyServer:
    """Owns the listeners, the node directory and every connection pair."""

    def __init__(
        self,
        config: ProxyConfig,
        bootstrap: tuple[tuple[str, int], ...] | None = None,
        tap: ResponseTap | None = None,
        routing: TopicRouting | None = None,
        base_dir: Path | None = None,
        *,
        worker: WorkerRole | None = None,
    ) -> None:
        self.worker = worker
        if worker is not None:
            config = config.model_copy(
                update={
                    "metrics": config.metrics.model_copy(update={"host": "127.0.0.1", "port": 0})
                }
            )
        self.config = config
        self.base_dir = base_dir or Path.cwd()
        self.tap = tap
        self.routing = routing if routing is not None else build_routing_for(config, Path.cwd())
        self._bootstrap = bootstrap if bootstrap is not None else config.upstream.addresses()
        if not self._bootstrap:
            raise ProxyError("no bootstrap servers to connect to")
        self._nodes: dict[int, tuple[str, int]] = {}
        self._port_owners: dict[int, int] = {}
        """port -> the node id that claimed it first: the mapping never changes while running."""
        self._unmapped: set[int] = set()
        """Node ids the cluster named that have no port (each logged once)."""
        self._listener_failures: set[int] = set()
        """Node ids whose listener could not open (each logged once)."""
        self._listeners: dict[int | None, asyncio.Server] = {}
        self._listener_lock = asyncio.Lock()
        self._clients: set[ClientConnection] = set()
        self._per_listener: collections.Counter[int | None] = collections.Counter()
        self._per_client: collections.Counter[str] = collections.Counter()
        self._refused = 0
        """Connections refused since the last log line about them."""
        self._refused_logged_at = float("-inf")
        self.fds = FdExhaustion()
        """Running out of file descriptors, logged as such (not as an unreachable upstream)."""
        self._sweep_task: asyncio.Task[None] | None = None
        self.buffer_pool = BufferPool()
        """Large-frame buffers shared by every connection of this server (one event loop)."""
        limits = config.limits
        self.decode_memory = MemoryBudget(limits.decode_memory_bytes, "limits.decode_memory_bytes")
        self.receive_memory = MemoryBudget(
            limits.receive_buffer_bytes, "limits.receive_buffer_bytes"
        )
        """What the large frames being received from clients have declared, together."""
        self._receive_waiters: collections.deque[ClientConnection] = collections.deque()
        self._receive_waits_logged_at = float("-inf")
        """What every Produce request being decoded may hold together."""
        self._decode_thread = ThreadPoolExecutor(1, thread_name_prefix="kvproxy-decode")
        """Where a request too costly to check on the event loop is checked: one thread, so
        heavy requests wait for each other while every other client's requests keep flowing."""
        self._lag_task: asyncio.Task[None] | None = None
        self._decoding = 0
        """Pieces of work on the decoding thread, running or queued."""
        self._switch_interval = sys.getswitchinterval()
        self._upstreams = 0
        self._tasks = 0
        self._client_ssl = _client_side_ssl(config)
        self._upstream_ssl = _upstream_side_ssl(config)
        self._stopping = False
        self.topic_configs = TopicConfigCache(
            lambda: self._bootstrap,
            self._upstream_ssl,
            config.topic_configs.ttl_ms / 1000,
            config.upstream.connect_timeout_ms / 1000,
        )
        self.produce_engine: ProduceEngine | None = self._make_engine()
        self.rejection_log = RejectionLogger(
            rate=config.logs.rejections_per_window,
            window_s=config.logs.rejection_window_ms / 1000,
            total_rate=config.logs.rejection_lines_per_window,
        )
        self.metrics = ProxyMetrics(config.metrics.topic_label_limit)
        self.metrics.decode_memory.set_function(lambda: self.decode_memory.in_use)
        self.metrics.receive_memory.set_function(lambda: self.receive_memory.in_use)
        self.metrics.topic_labels.lookup = self._topics_exist
        # A lambda, not the bound method: a reload replaces self.routing.
        self.metrics.watch_policy_crashes(lambda: self.routing.crash_counts())  # noqa: PLW0108
        self.journal = self._make_journal()
        self.metrics.watch_journal(lambda: self.journal)
        quarantine = config.quarantine
        self._dead_letter_for = any_of(quarantine.dead_letter_topics)
        self._http: asyncio.Server | None = None
        self._readiness_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._ready_cache: tuple[float, bool, str] = (0.0, False, "not checked yet")
        self._cluster_answer: str | None = None
        """What the first Metadata answer said; None until the cluster has answered."""
        self._cluster_problem: str | None = None
        self.rejection_listeners: list[Callable[[RejectionEvent], None]] = []
        """Told of every rejection as it happens, unthrottled (`kvproxy demo` prints them)."""
        self.rejections: collections.Counter[tuple[str, str, int]] = collections.Counter()
        """(topic, policy, code) -> partitions rejected (warn mode: would have been), for the
        latest `MAX_REJECTION_KEYS` keys (clients choose topic names)."""

    # ---- receive memory ----

    def wait_for_receive_memory(self, client: ClientConnection) -> None:
        """`client` stopped reading until its large frame can reserve receive memory."""
        if client not in self._receive_waiters:
            self._receive_waiters.append(client)
        self.metrics.receive_waits.inc()
        now = time.monotonic()
        if now - self._receive_waits_logged_at >= REFUSAL_LOG_INTERVAL_S:
            self._receive_waits_logged_at = now
            log.warning(
                "client %s waits to send a %d-byte request: the requests being received hold "
                "%d of %d bytes (limits.receive_buffer_bytes); %d connections wait",
                client.peer,
                client.waiting_frame or 0,
                self.receive_memory.in_use,
                self.receive_memory.limit,
                len(self._receive_waiters),
            )

    def wake_receive_waiters(self) -> None:
        """Let waiting connections start their frames, oldest first, while memory lasts."""
        waiters = self._receive_waiters
        while waiters and waiters[0].retry_receive():
            waiters.popleft()

    # ---- produce policies ----

    def decide_inline(
        self, engine: ProduceEngine, payload: Frame, request: Request
    ) -> ProduceDecision | None:
        """The decision, made on the event loop, or None when it needs more than
        `INLINE_DECODE_BYTES` of decoding or more than the engine's inline record count."""
        allowance = Allowance(INLINE_DECODE_BYTES, self.decode_memory, inline=True)
        try:
            return engine.decide(payload, request, allowance=allowance)
        except InlineLimitReached:
            return None
        finally:
            allowance.release()

    async def decide_off_loop(
        self, engine: ProduceEngine, payload: Frame, request: Request
    ) -> ProduceDecision:
        """The decision, made on the decoding thread with the full per-request allowance."""
        topics = engine.topic_view(request)  # the routing's caches are read on the loop only
        allowance = Allowance(self.config.limits.decode_bytes_per_request, self.decode_memory)
        self.metrics.off_loop_decisions.inc()

        def decide() -> ProduceDecision:
            try:
                return engine.decide(payload, request, allowance=allowance, topics=topics)
            finally:
                allowance.release()

        return await self._off_loop(decide)

    async def _off_loop(self, work: Callable[[], T]) -> T:
        """Run `work` on the decoding thread. Meanwhile the interpreter switches threads every
        `DECODING_SWITCH_INTERVAL_S` rather than every 5 ms: the event loop gives up the GIL
        at every wait for I/O and must win it back each time, so with CPU-bound decoding beside
        it every loop iteration could cost a whole switch interval."""
        if self._decoding == 0:
            self._switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(DECODING_SWITCH_INTERVAL_S)
        self._decoding += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._decode_thread, work)
        finally:
            self._decoding -= 1
            if self._decoding == 0:
                sys.setswitchinterval(self._switch_interval)

    async def _watch_loop_lag(self) -> None:
        """How late a timer due every `LAG_TICK_S` runs: the longest the loop was held."""
        loop = asyncio.get_running_loop()
        recent: collections.deque[tuple[float, float]] = collections.deque()
        while not self._stopping:
            due = loop.time() + LAG_TICK_S
            await asyncio.sleep(LAG_TICK_S)
            now = loop.time()
            lag = max(0.0, now - due)
            self.metrics.loop_lag.observe(lag)
            while recent and (recent[0][0] < now - LAG_WINDOW_S or recent[0][1] <= lag):
                recent.popleft()
            while recent and recent[-1][1] <= lag:
                recent.pop()
            recent.append((now, lag))  # decreasing lags: the first is the window's longest
            self.metrics.loop_lag_max.set(recent[0][1])

    def topics_to_describe(self, request: Request) -> list[str]:
        """Topics whose settings a check reads, that the YAML does not give and the proxy has
        not learned yet (`TopicRouting.settings_needed`)."""
        wanted = []
        for topic_data in request.body.topic_data:
            topic = str(getattr(topic_data, "name", ""))
            if self.routing.settings_needed(topic) and not self.topic_configs.known(topic):
                wanted.append(topic)
        return wanted

    async def describe_topics(self, topics: list[str]) -> None:
        await self.topic_configs.refresh(topics)

    def report(self, decision: ProduceDecision, client_id: str | None, peer: str) -> None:
        """Log and count every rejection (and, in warn mode, every would-be rejection)."""
        for outcome in [*decision.rejected, *decision.warned]:
            verdict = outcome.verdict
            policy = verdict.policy or "?"
            key = (clip(outcome.topic, MAX_TOPIC_CHARS), policy, verdict.code)
            if key not in self.rejections and len(self.rejections) >= MAX_REJECTION_KEYS:
                del self.rejections[next(iter(self.rejections))]
            self.rejections[key] += 1
            self.metrics.topic_labels.count(
                self.metrics.rejections, outcome.topic, (policy, str(verdict.code))
            )
            self._quarantine(outcome, decision.api_version, client_id, peer)
            event = RejectionEvent(
                topic=outcome.topic,
                partition=outcome.index,
                policy=policy,
                code=verdict.code,
                message=verdict.message,
                client_id=client_id,
                client_address=peer,
                enforced=outcome.enforced,
            )
            self.rejection_log.rejected(event)
            for listener in list(self.rejection_listeners):
                try:
                    listener(event)
                except Exception:  # a listener never changes an answer: it is dropped
                    log.exception("rejection listener %r failed: no longer told", listener)
                    self.rejection_listeners.remove(listener)

    def _make_journal(self) -> Journal | None:
        settings = self.config.quarantine
        if settings.dir is None:
            return None
        directory = settings.dir if settings.dir.is_absolute() else self.base_dir / settings.dir
        if self.worker is not None:
            directory = directory / f"{WORKER_DIR_PREFIX}{self.worker.index}"
        return Journal(
            directory,
            segment_bytes=settings.segment_bytes,
            retention_bytes=settings.retention_bytes,
            retention_ms=settings.retention_ms,
            flush_interval_ms=settings.flush_interval_ms,
            on_error=lambda why: log.error(
                "quarantine journal %s cannot be written: %s (clients are still answered)",
                directory,
                why,
            ),
        )

    def _quarantine(
        self, outcome: PartitionOutcome, version: int, client_id: str | None, peer: str
    ) -> None:
        """Keep what was refused (or, in warn mode, would have been) and copy it to the
        dead-letter topic when configured. Neither ever changes the client's answer.

        A batch the proxy had no memory to decompress is neither: its client is told to send it
        again (`OutOfMemory`), and a kept copy would be a second one once it does."""
        verdict = outcome.verdict
        if verdict.policy == DECODE_BUDGET and verdict.code == OutOfMemory.error_code:
            return
        if self.journal is not None:
            self.journal.append(
                QuarantineEntry(
                    id=uuid.uuid4().hex,
                    time_ms=int(time.time() * 1000),
                    kind="rejected" if outcome.enforced else "warned",
                    topic=outcome.topic,
                    partition=outcome.index,
                    client_id=client_id,
                    client_address=peer,
                    produce_version=version,
                    policy=verdict.policy,
                    code=verdict.code,
                    message=verdict.message,
                    record_indexes=tuple(e.index for e in verdict.record_errors),
                    records=bytes(outcome.raw),
                )
            )
        suffix = self.config.quarantine.dead_letter_suffix
        if suffix and outcome.enforced and self._dead_letter_for(outcome.topic):
            if outcome.topic.endswith(suffix):
                return  # never a dead letter of a dead letter
            make = functools.partial(
                dead_letter_records,
                bytes(outcome.raw),
                policy=verdict.policy or "?",
                code=verdict.code,
                message=verdict.message,
                partition=outcome.index,
                client_id=client_id,
            )
            task = asyncio.get_running_loop().create_task(
                self._send_dead_letter(outcome.topic + suffix, outcome.index, make)
            )
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _send_dead_letter(
        self, topic: str, partition: int, make: Callable[..., bytes]
    ) -> None:
        """Build the dead letter on the decoding thread (decoding the refused records costs what
        checking them did, with the same budget), then send it."""
        allowance = Allowance(self.config.limits.decode_bytes_per_request, self.decode_memory)

        def build() -> bytes:
            try:
                return make(allowance=allowance)
            finally:
                allowance.release()

        try:
            batch = await self._off_loop(build)
        except Exception as exc:  # e.g. no memory to compress the copy: counted, never raised
            self.metrics.dead_letters.labels("failed").inc()
            log.warning("dead letter for %s-%d not built: %r", topic, partition, exc)
            return
        try:
            await send_dead_letter(
                list(self._bootstrap),
                self._upstream_ssl,
                self.config.upstream.connect_timeout_ms / 1000,
                topic=topic,
                partition=partition,
                batch=batch,
            )
        except ConnectionError as exc:
            self.metrics.dead_letters.labels("failed").inc()
            log.warning("dead letter not written: %s", exc)
        else:
            self.metrics.dead_letters.labels("written").inc()

    def count_produced(self, decision: ProduceDecision) -> None:
        """Batches and records by topic and verdict."""
        metrics = self.metrics
        for outcome in decision.outcomes:
            if outcome.produced is None:
                continue
            if outcome.rejected:
                verdict = "rejected"
            elif not outcome.verdict.ok:
                verdict = "warned"
            else:
                verdict = "accepted"
            labels = metrics.topic_labels
            batches = outcome.produced.batches
            labels.count(metrics.batches, outcome.topic, (verdict,), len(batches))
            labels.count(
                metrics.records,
                outcome.topic,
                (verdict,),
                max(0, sum(b.counted_records for b in batches)),
            )

    async def _topics_exist(self, topics: list[str]) -> dict[str, bool | None]:
        """Which of `topics` the cluster has, asked of the first bootstrap server that answers
        (the topic label of the metrics); ConnectionError when none does."""
        timeout = self.config.upstream.connect_timeout_ms / 1000
        problem = "none configured"
        for host, port in list(self._bootstrap):
            try:
                return await topics_exist(host, port, self._upstream_ssl, timeout, topics)
            except (OSError, TimeoutError, ProtocolError) as exc:
                problem = describe_failure(exc, timeout)
        raise ConnectionError(f"no bootstrap server answered Metadata: {problem}")

    def record_reload(self, result: str) -> None:
        """Count a configuration reload ("success" or "failure")."""
        self.metrics.reloads.labels(result).inc()

    def replace_rules(self, config: ProxyConfig, routing: TopicRouting) -> TopicRouting:
        """Swap in new policy rules (a reload); returns the old routing for the caller to close.

        Requests already decided keep their verdicts and are answered under the rules they were
        judged by (`ProduceDecision.engine`); the next request uses the new rules. The
        listeners and upstream settings of `config` are not re-read: they need a restart.
        """
        old = self.routing
        self.routing = routing
        self.config = self.config.model_copy(
            update={
                "errors": config.errors,
                "reject": config.reject,
                "defaults": config.defaults,
                "topics": config.topics,
                "topic_configs": config.topic_configs,
            }
        )
        self.topic_configs.ttl_s = config.topic_configs.ttl_ms / 1000  # answers from now on
        self.produce_engine = self._make_engine()
        return old

    def _make_engine(self) -> ProduceEngine:
        errors = self.config.errors
        return ProduceEngine(
            self.routing,
            ProduceSettings(
                profile=ErrorProfile(errors.profile),
                legacy_below=errors.legacy_below,
                legacy_code=errors.legacy_code,
                reject_request=self.config.reject == "request",
                max_records_per_request=self.config.limits.max_records_per_request,
            ),
            self.topic_configs.compacted,
            self.topic_configs.config,
        )

    # ---- addresses ----

    @property
    def public_host(self) -> str:
        return self.config.listen.public_host

    def port_for(self, node_id: int) -> int:
        """The listener port of node `node_id`, claimed for it for the life of this process;
        ProxyError when the mapping gives it none or another node holds that port."""
        listen = self.config.listen
        try:
            port = listen.broker_port(node_id)
        except NodePortError as exc:
            raise ProxyError(str(exc)) from None
        owner = self._port_owners.setdefault(port, node_id)
        if owner != node_id:
            raise ProxyError(shared_port_problem(owner, node_id, port, listen.max_brokers))
        return port

    def port_or_none(self, node_id: int) -> int | None:
        """As `port_for`, but None (logged once per node) for a node with no port: answers to
        clients leave such a node out rather than fail, so the other brokers stay usable."""
        try:
            return self.port_for(node_id)
        except ProxyError as exc:
            if node_id not in self._unmapped and len(self._unmapped) < _MAX_UNMAPPED_LOGGED:
                self._unmapped.add(node_id)
                log.error("%s; answers to clients leave node %d out", exc, node_id)
                self.metrics.unmapped_nodes.set(len(self._unmapped))
            return None

    @property
    def bootstrap_port(self) -> int:
        return int(self._listeners[None].sockets[0].getsockname()[1])

    @property
    def bootstrap_servers(self) -> tuple[tuple[str, int], ...]:
        return self._bootstrap

    @property
    def nodes(self) -> dict[int, tuple[str, int]]:
        return dict(self._nodes)

    def knows_nodes(self, nodes: dict[int, tuple[str, int]]) -> bool:
        """True when every node is known at that address and has its listener open."""
        return all(
            self._nodes.get(node_id) == address and node_id in self._listeners
            for node_id, address in nodes.items()
        )

    async def learn_node(self, node_id: int, address: tuple[str, int]) -> None:
        """Remember where node `node_id` lives and make sure its listener is open."""
        self._nodes[node_id] = address
        await self._ensure_listener(node_id)

    async def learn_node_or_log(self, node_id: int, address: tuple[str, int]) -> None:
        """As `learn_node`, for a node an answer to a client names: a listener that cannot
        open (its port taken by another process) is logged once, and the answer still goes out,
        so one broker's port never fails every client's Metadata request."""
        try:
            await self.learn_node(node_id, address)
        except (OSError, ProxyError) as exc:
            if node_id not in self._listener_failures:
                if len(self._listener_failures) < _MAX_UNMAPPED_LOGGED:
                    self._listener_failures.add(node_id)
                log.error("cannot open the listener for node %d: %s", node_id, exc)

    async def _ensure_listener(self, node_id: int | None) -> None:
        if node_id in self._listeners or self._stopping:
            return
        async with self._listener_lock:
            if node_id in self._listeners:
                return
            port = self.config.listen.port if node_id is None else self.port_for(node_id)
            loop = asyncio.get_running_loop()
            server = await loop.create_server(
                lambda: ClientConnection(self, node_id),
                host=self.config.listen.host,
                port=port,
                ssl=self._client_ssl,
                reuse_address=True,
                reuse_port=self.worker is not None,
            )
            self._listeners[node_id] = server
            bound = server.sockets[0].getsockname()
            what = "bootstrap" if node_id is None else f"node {node_id}"
            log.info("listening for %s on %s:%s", what, bound[0], bound[1])

    # ---- upstream ----

    async def open_upstream(
        self, client: ClientConnection, node_id: int | None
    ) -> UpstreamConnection:
        if node_id is None:
            candidates = list(self._bootstrap)
        else:
            if node_id not in self._nodes:
                await self._refresh_nodes()
            if node_id not in self._nodes:
                raise ProxyError(f"the cluster does not name node {node_id}")
            candidates = [self._nodes[node_id]]
        errors = []
        for host, port in candidates:
            try:
                upstream = await self._connect(client, host, port)
            except (OSError, TimeoutError) as exc:
                if out_of_fds(exc):  # the proxy's shortage, not the broker's: not counted
                    what = f"closed the connection of client {client.peer}: no descriptor left"
                    self.fds.report(f"{what} for its connection to {host}:{port}", exc)
                    raise OutOfFileDescriptors("out of file descriptors") from exc
                why = describe_failure(exc, self.config.upstream.connect_timeout_ms / 1000)
                errors.append(f"{host}:{port}: {why}")
                self.metrics.connect_failures.labels(f"{host}:{port}").inc()
                log.warning("upstream %s:%s unreachable: %s", host, port, why)
                continue
            self._upstreams += 1
            self.metrics.upstream_connections.inc()
            return upstream
        raise ProxyError("no upstream reachable (" + "; ".join(errors) + ")")

    async def _connect(self, client: ClientConnection, host: str, port: int) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        timeout = self.config.upstream.connect_timeout_ms / 1000
        _, upstream = await asyncio.wait_for(
            loop.create_connection(
                lambda: UpstreamConnection(client, self.config.limits.max_frame_bytes),
                host,
                port,
                ssl=self._upstream_ssl,
                server_hostname=host if self._upstream_ssl is not None else None,
            ),
            timeout,
        )
        assert upstream.transport is not None
        upstream.transport.set_write_buffer_limits(high=self.config.limits.write_buffer_high_bytes)
        return upstream

    async def _refresh_nodes(self, *, strict: bool = False) -> bool:
        """Ask a bootstrap server for Metadata and learn the brokers it names; True when one
        answered. A client may reach a broker listener before the proxy (restarted, say) has
        seen an answer naming that broker.

        `strict` (at start): a node with no port raises ProxyError, so `serve` refuses to run
        rather than serve part of the cluster; later such a node is logged and left out.

        A SASL-only listener closes the connection on the proxy's Metadata request (it carries
        no credentials) but answers ApiVersions, which Kafka serves before authentication: such
        a cluster has answered too, and its brokers are learnt from clients' answers."""
        from proxy.upstream_client import (  # noqa: PLC0415
            answers_api_versions,
            fetch_broker_addresses,
        )

        timeout = self.config.upstream.connect_timeout_ms / 1000
        problems = []
        for host, port in self._bootstrap:
            try:
                nodes = await fetch_broker_addresses(host, port, self._upstream_ssl, timeout)
            except (OSError, TimeoutError, ProtocolError) as exc:
                why = describe_failure(exc, timeout)
                if isinstance(exc, ConnectionError) and await answers_api_versions(
                    host, port, self._upstream_ssl, timeout
                ):
                    self._answered(
                        f"the cluster answered ApiVersions at {host}:{port} but closed the "
                        f"connection on Metadata ({why}): a listener that requires "
                        "authentication? Broker listeners open as clients' answers name them",
                        logging.WARNING,
                    )
                    return True
                problems.append(f"metadata from {host}:{port} failed: {why}")
                continue
            for node_id, address in sorted(nodes.items()):
                if strict:
                    await self.learn_node(node_id, address)
                elif self.port_or_none(node_id) is not None:
                    await self.learn_node_or_log(node_id, address)
            self._answered(f"the cluster answered: {len(nodes)} broker(s) at {host}:{port}")
            return True
        problem = "; ".join(problems)
        if problem != self._cluster_problem:  # each new reason once, not every retry
            log.warning("%s", problem)
        self._cluster_problem = problem
        return False

    def _answered(self, what: str, level: int = logging.INFO) -> None:
        first = self._cluster_answer is None
        late = first and self._cluster_problem is not None
        self._cluster_answer = what
        self._cluster_problem = None
        if first:
            self._ready_cache = (float("-inf"), False, "")  # /readyz: check again now
        if late:  # serve logged "not ready" at start: say when that ended
            log.log(level, "kvproxy ready: %s", what)
        elif first and level > logging.INFO:
            log.log(level, "%s", what)

    @property
    def cluster_answered(self) -> bool:
        """Whether a bootstrap server has answered the proxy's Metadata request (or, closing
        the connection on it, ApiVersions)."""
        return self._cluster_answer is not None

    @property
    def cluster_problem(self) -> str | None:
        """Why the last Metadata request failed (None after an answer)."""
        return self._cluster_problem

    # ---- lifecycle ----

    async def start(self) -> None:
        """Open the bootstrap listener, then a listener for every broker the cluster names now,
        so clients holding broker addresses from an earlier run find them open."""
        return_large_buffers_to_the_os()
        if self.journal is not None:  # reading the segments is disk work: off the event loop
            report = await asyncio.get_running_loop().run_in_executor(None, self.journal.open)
            log.info(
                "quarantine journal %s: %d entries in %d segments%s",
                self.journal.directory,
                report.entries,
                report.segments,
                f", torn tail of {report.truncated_bytes} bytes truncated"
                if report.truncated_bytes
                else "",
            )
        self.fds.start()  # accept errors and the descriptor check
        await self._ensure_listener(None)
        await self._refresh_nodes(strict=True)
        settings = self.config.metrics
        if settings.enabled:
            try:
                self._http = await start_http_endpoint(
                    settings.host, settings.port, self.metrics, self.readiness
                )
            except OSError as exc:  # the data path matters more than its metrics
                log.error(
                    "metrics endpoint %s:%s unavailable: %s", settings.host, settings.port, exc
                )
            else:
                bound = self._http.sockets[0].getsockname()
                log.info("metrics, /healthz and /readyz on http://%s:%s", bound[0], bound[1])

        self._readiness_task = asyncio.get_running_loop().create_task(self._watch_readiness())
        self._sweep_task = asyncio.get_running_loop().create_task(self._sweep())
        self._lag_task = asyncio.get_running_loop().create_task(self._watch_loop_lag())

    async def _sweep(self) -> None:
        """Close idle and stalled client connections: one pass over them every tick.

        One task for the whole server instead of a timer per connection, so neither a read nor a
        request ever touches a timer. A tenth of the shorter timeout (between 10 ms and 5 s) per
        tick: a connection is closed at most that much later than its timeout.
        """
        limits = self.config.limits
        idle_after = limits.idle_timeout_ms / 1000
        stall_after = limits.request_timeout_ms / 1000
        tick = min(max(min(idle_after, stall_after) / 10, _SWEEP_MIN_S), _SWEEP_MAX_S)
        loop = asyncio.get_running_loop()
        while not self._stopping:
            await asyncio.sleep(tick)
            now = loop.time()
            for client in list(self._clients):
                client.check_timeouts(now, idle_after, stall_after)
            self._log_refusals(now)

    async def _watch_readiness(self) -> None:
        """Keep `kvproxy_ready` current even when nothing polls /readyz; until the cluster has
        answered a Metadata request, ask again every `METADATA_RETRY_S`."""
        while not self._stopping:
            if not self.cluster_answered:
                await self._refresh_nodes()
            await self.readiness()
            await asyncio.sleep(READINESS_INTERVAL_S if self.cluster_answered else METADATA_RETRY_S)

    @property
    def metrics_port(self) -> int | None:
        if self._http is None:
            return None
        return int(self._http.sockets[0].getsockname()[1])

    async def readiness(self) -> tuple[bool, str]:
        """Ready once the cluster has answered the proxy's Metadata request and while at least
        one bootstrap server accepts a connection (checked at most once a second)."""
        loop = asyncio.get_running_loop()
        checked_at, ready, why = self._ready_cache
        if loop.time() - checked_at < 1.0:
            return ready, why
        if not self.cluster_answered:
            why = f"not ready: {self._cluster_problem or 'the cluster has not answered yet'}"
            self._ready_cache = (loop.time(), False, why)
            self.metrics.ready.set(0)
            return False, why
        ready, why = False, "no upstream reachable"
        timeout = min(1.0, self.config.upstream.connect_timeout_ms / 1000)
        for host, port in self._bootstrap:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
            except (OSError, TimeoutError) as exc:
                if out_of_fds(exc):  # say so, rather than "no upstream reachable"
                    self.fds.report("the readiness check could not open a connection", exc)
                    why = f"not ready: {describe_fd_shortage(exc)}"
                    break
                continue
            writer.close()
            ready, why = True, f"ready: upstream {host}:{port} reachable"
            break
        if ready and self.journal is not None and self.journal.degraded:
            problem = self.journal.degraded
            why = f"ready, degraded: the quarantine journal cannot be written: {problem}"
        self._ready_cache = (loop.time(), ready, why)
        self.metrics.ready.set(1 if ready else 0)
        return ready, why

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish (bounded), then close everything."""
        self._stopping = True
        self.fds.stop()
        if self._readiness_task is not None:
            self._readiness_task.cancel()
        if self._sweep_task is not None:
            self._sweep_task.cancel()
        if self._lag_task is not None:
            self._lag_task.cancel()
        if self._http is not None:
            self._http.close()
        if drain_timeout is None:
            drain_timeout = self.config.shutdown.drain_timeout_ms / 1000
        for server in self._listeners.values():
            server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_timeout
        while any(client.in_flight for client in self._clients) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for client in list(self._clients):
            client.close()
        for server in self._listeners.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        deadline = loop.time() + 2.0
        while (self._clients or self._tasks or self._background) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        self.metrics.topic_labels.close()  # after the drain: its requests were counted
        self._decode_thread.shutdown(wait=False, cancel_futures=True)
        if self.journal is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.journal.close)

    def connection_opened(self, client: ClientConnection) -> bool:
        """Count a new client connection; False (and counted as refused) when it would pass
        `limits.max_connections_per_listener` or `limits.max_connections_per_client`."""
        limits = self.config.limits
        listener, host = client.node_id, client.client_host
        if (
            self._per_listener[listener] >= limits.max_connections_per_listener
            or self._per_client[host] >= limits.max_connections_per_client
        ):
            self.metrics.closed.labels("too_many_connections").inc()
            self._refused += 1
            self._log_refusals(asyncio.get_running_loop().time(), client)
            return False
        self._per_listener[listener] += 1
        self._per_client[host] += 1
        self._clients.add(client)
        self.metrics.client_connections.inc()
        return True

    def _log_refusals(self, now: float, client: ClientConnection | None = None) -> None:
        """One line per `REFUSAL_LOG_INTERVAL_S` at most, however many connections a flood
        brings: the first refusal of a quiet period at once, the rest summed up later."""
        if not self._refused or now - self._refused_logged_at < REFUSAL_LOG_INTERVAL_S:
            return
        limits = self.config.limits
        if client is not None and self._refused == 1:
            listener = "bootstrap" if client.node_id is None else f"node {client.node_id}"
            log.warning(
                "refusing a connection from %s on the %s listener: %d open from that address "
                "(limit %d), %d on the listener (limit %d)",
                client.peer,
                listener,
                self._per_client[client.client_host],
                limits.max_connections_per_client,
                self._per_listener[client.node_id],
                limits.max_connections_per_listener,
            )
        else:
            log.warning(
                "refused %d connections over the connection limits in the last %.0f s "
                "(max_connections_per_client %d, max_connections_per_listener %d)",
                self._refused,
                min(now - self._refused_logged_at, 1e9),
                limits.max_connections_per_client,
                limits.max_connections_per_listener,
            )
        self._refused = 0
        self._refused_logged_at = now

    def connection_closed(self, client: ClientConnection) -> None:
        if client in self._clients:
            self._clients.discard(client)
            self.metrics.client_connections.dec()
            self._forget(self._per_listener, client.node_id)
            self._forget(self._per_client, client.client_host)

    @staticmethod
    def _forget(counts: collections.Counter[Any], key: Any) -> None:
        if counts[key] <= 1:
            del counts[key]  # a client address that has gone leaves nothing behind
        else:
            counts[key] -= 1

    def upstream_closed(self) -> None:
        self._upstreams -= 1
        self.metrics.upstream_connections.dec()

    def task_started(self) -> None:
        self._tasks += 1

    def task_finished(self) -> None:
        self._tasks -= 1

    def stats(self) -> ProxyStats:
        return ProxyStats(
            client_connections=len(self._clients),
            upstream_connections=self._upstreams,
            listeners=len(self._listeners),
            pending_tasks=self._tasks,
        )


def build_routing_for(config: ProxyConfig, base_dir: Path) -> TopicRouting:
    """The policy chains of `config`; schema files resolve against `base_dir`."""
    try:
        return build_routing(config.defaults, config.topics, base_dir)
    except PolicyConfigError as exc:
        raise ProxyError(str(exc)) from None


def _client_side_ssl(config: ProxyConfig) -> ssl.SSLContext | None:
    tls = config.listen.tls
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    password = tls.key_password.get_secret_value() if tls.key_password is not None else None
    context.load_cert_chain(str(tls.cert_file), str(tls.key_file), password)
    if tls.client_ca_file is not None:
        context.load_verify_locations(cafile=str(tls.client_ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _upstream_side_ssl(config: ProxyConfig) -> ssl.SSLContext | None:
    tls = config.upstream.tls
    if tls is None:
        return None
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=str(tls.ca_file) if tls.ca_file else None
    )
    context.check_hostname = tls.check_hostname  # verify_mode stays CERT_REQUIRED either way
    if tls.cert_file is not None:
        password = tls.key_password.get_secret_value() if tls.key_password is not None else None
        context.load_cert_chain(
            str(tls.cert_file), str(tls.key_file) if tls.key_file else None, password
        )
    return context
