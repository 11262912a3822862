"""The broker side of a client connection: requests out, answers in, each matched to the request
it answers and made ready for the client.

The client side hands over each request with the slot its answer fills; the broker answers in
the order it was sent requests, so the answers are matched against a FIFO of those slots (an
acks=0 request's `silent` slot is dropped unless the broker answers it anyway). Answers naming
brokers are rewritten to the proxy's addresses, the large ones off the loop; a Produce answer
is merged with the proxy's own refusals by its `ProduceExchange`.
"""

from __future__ import annotations

import asyncio
import collections
import struct
import time
from typing import TYPE_CHECKING, cast

from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.fast_accept import answer_plain
from kvproxy.protocol.framing import Frame, FrameDecoder, pack_size
from kvproxy.protocol.messages import PRODUCE
from kvproxy.proxy.cluster.rewrite import (
    needs_rewrite,
    rewrite_inline,
    rewrite_off_loop,
    rewrite_response,
)
from kvproxy.proxy.errors import ProxyError
from kvproxy.proxy.relay.close_reasons import CloseReason, PauseReason
from kvproxy.proxy.relay.response_slots import MAX_SILENT_SLOTS, Slot, answers_silent

if TYPE_CHECKING:
    from kvproxy.proxy.relay.client_connection import ClientConnection

_CORRELATION = struct.Struct(">i")


class UpstreamConnection(asyncio.BufferedProtocol):
    """The broker side of one client connection: it writes the requests, matches the answers.

    A buffered protocol: the transport reads into the frame decoder's buffers, so a large answer
    (a Fetch) reaches the client without being copied in between.
    """

    def __init__(
        self, client: ClientConnection, max_frame_bytes: int, write_buffer_high_bytes: int
    ) -> None:
        self._client = client
        self._write_buffer_high_bytes = write_buffer_high_bytes
        self._bytes_in = client.metrics.child(client.metrics.bytes, "upstream_in")
        self._bytes_out = client.metrics.child(client.metrics.bytes, "upstream_out")
        self._decoder = FrameDecoder(max_frame_bytes, client.buffer_pool)
        self.awaiting: collections.deque[Slot] = collections.deque()
        """The requests sent, in order, whose answers (or acks=0 non-answers) are due."""
        self._batch: list[Frame] | None = None
        """While a client read is handled: the requests it passed, sent in one write after."""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=self._write_buffer_high_bytes)

    # ---- requests out ----

    def send(self, slot: Slot, payload: Frame) -> None:
        """Write a request whose answer fills `slot` (in the batch while one is open)."""
        awaiting = self.awaiting
        if slot.silent and len(awaiting) >= MAX_SILENT_SLOTS and awaiting[0].silent:
            awaiting.popleft()
        awaiting.append(slot)
        if self._batch is not None:
            self._batch += (pack_size(len(payload)), payload)
        elif self.transport is not None:
            self.transport.writelines((pack_size(len(payload)), payload))
        self._bytes_out.pending += len(payload) + 4

    def open_batch(self) -> None:
        """Gather what is sent from now on into one write (`write_batch`)."""
        self._batch = []

    def write_batch(self) -> None:
        batch, self._batch = self._batch, None
        if batch and self.transport is not None:
            self.transport.writelines(batch)

    def pause_reading(self) -> None:
        """Stop reading answers (the client reads its own too slowly)."""
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def close(self) -> None:
        """Close once what was sent, the open batch too, has been written: requests accepted
        before a close still reach the broker."""
        self.write_batch()
        if self.transport is not None:
            self.transport.close()

    # ---- answers in ----

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._bytes_in.pending += nbytes  # a tally (ops/metric_tallies.py): never negative
        self._decoder.buffer_updated(nbytes)
        client = self._client
        try:
            while (payload := self._decoder.next_frame()) is not None:
                self._on_answer(payload)
        except ProtocolError as exc:
            client.abort(f"upstream sent an undecodable frame: {exc}")
        client.flush()  # every answer this read completed, in one write

    def _on_answer(self, payload: Frame) -> None:
        slot = self._answered(payload)
        if slot is None:
            return
        if slot.sent_at:
            self._client.metrics.upstream_latency.observe(time.perf_counter() - slot.sent_at)
        if len(payload) < 4 or _CORRELATION.unpack_from(payload)[0] != slot.correlation_id:
            self._client.abort(
                f"upstream answered out of order (expected {slot.correlation_id})",
                reason=CloseReason.UPSTREAM_ERROR,
            )
            return
        if slot.api_key == PRODUCE and answer_plain(payload, slot.api_version):
            if slot.exchange is None:  # accepted whole by the compiled fast accept
                slot.payload = payload  # names no broker, nothing to merge: as the broker wrote it
            else:
                self._fill(slot, payload)  # names no broker: nothing to rewrite
            return
        if needs_rewrite(slot.api_key, slot.api_version):
            if not rewrite_inline(payload, slot.api_key, slot.api_version):  # off the loop
                self._client.spawn(self._learn_then_answer(slot, payload, None))
                return
            nodes = self._client.state.nodes
            try:
                payload, learned = rewrite_response(
                    payload,
                    slot.api_key,
                    slot.api_version,
                    nodes.addresses_for(self._client.listener),
                    topics_seen=self._client.metrics.topic_labels.seen,
                    unknown_apis=self._client.state.unknown_apis,
                    topic_ids_seen=self._client.state.decisions.topic_ids.learn,
                )
            except (ProtocolError, ProxyError) as exc:
                self._cannot_rewrite(slot, exc)
                return
            if not nodes.knows_nodes(learned):  # a listener to open first: the answer waits
                self._client.spawn(self._learn_then_answer(slot, payload, learned))
                return
        self._fill(slot, payload)
        # the caller flushes once the read is done

    def _answered(self, payload: Frame) -> Slot | None:
        """The slot `payload` answers; None when it is an acks=0 request's (dropped) or when it
        answers nothing the proxy can tell (the connection is closed)."""
        awaiting = self.awaiting
        correlation_id = _CORRELATION.unpack_from(payload)[0] if len(payload) >= 4 else None
        while awaiting and awaiting[0].silent:
            silent = awaiting.popleft()
            if silent.correlation_id != correlation_id:
                continue
            owner = answers_silent(awaiting, silent, payload)
            if owner is None:
                self._client.abort(
                    f"answer with correlation id {correlation_id} could be the acks=0 request's "
                    "or a later one's: closing rather than guessing",
                    reason=CloseReason.UPSTREAM_ERROR,
                )
                return None
            if owner:
                return None  # the broker answered an acks=0 request: the client expects nothing
        if not awaiting:
            self._client.abort(
                "upstream sent an answer nobody asked for", reason=CloseReason.UPSTREAM_ERROR
            )
            return None
        return awaiting.popleft()

    async def _learn_then_answer(
        self, slot: Slot, payload: Frame, learned: dict[int, tuple[str, int]] | None
    ) -> None:
        client = self._client
        nodes = client.state.nodes
        if learned is None:  # a large answer, not rewritten yet
            try:
                payload, learned = await rewrite_off_loop(
                    payload,
                    slot.api_key,
                    slot.api_version,
                    nodes.addresses_for(client.listener),
                    topics_seen=client.metrics.topic_labels.seen,
                    off_loop=client.state.decisions.off_loop,
                    unknown_apis=client.state.unknown_apis,
                    topic_ids_seen=client.state.decisions.topic_ids.learn,
                )
            except (ProtocolError, ProxyError) as exc:
                self._cannot_rewrite(slot, exc)
                return
        for node_id, address in learned.items():
            await nodes.learn_node_or_log(node_id, address)
        self._fill(slot, payload)  # a node whose port is taken: its clients retry elsewhere
        client.flush()

    def _cannot_rewrite(self, slot: Slot, exc: Exception) -> None:
        self._client.abort(
            f"cannot rewrite the answer to api {slot.api_key} v{slot.api_version}: {exc}",
            reason=CloseReason.UPSTREAM_ERROR,
        )

    def _fill(self, slot: Slot, payload: Frame) -> None:
        """The answer goes into its slot; a Produce answer merged by its exchange."""
        exchange = slot.exchange
        try:
            slot.payload = payload if exchange is None else exchange.merged(payload)
        except ProtocolError as exc:
            self._client.abort(
                f"cannot merge the broker's produce answer: {exc}",
                reason=CloseReason.UPSTREAM_ERROR,
            )

    # ---- the client side's backpressure, and the end ----

    def pause_writing(self) -> None:
        self._client.pause_reading(PauseReason.UPSTREAM_FULL)

    def resume_writing(self) -> None:
        self._client.resume_reading(PauseReason.UPSTREAM_FULL)

    def connection_lost(self, exc: Exception | None) -> None:
        client = self._client
        client.on_upstream_lost(exc)
        # Break the client <-> upstream cycle, so a closed pair (and the frame buffers its
        # pending answers hold) is freed at once rather than by the cycle collector.
        client.upstream = None
