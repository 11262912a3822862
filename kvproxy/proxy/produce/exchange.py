"""One Produce request, from the decision of the policies to the answer the client gets.

A `ProduceExchange` is made for each Produce request a client connection reads (as uvicorn's
`RequestResponseCycle` for an HTTP request). It decides on the event loop when that is cheap;
otherwise it holds the connection's later requests (their answers must follow this one's),
decides in a task (topics described, schema ids looked up, on the decoding thread if costly) and
then hands the held requests back in order. Decided, it records the refusals, forwards what
passed and, when the broker answers, merges that answer with the proxy's own errors.

The exchange keeps no reference to its connection: the connection is an argument of the steps
that need it, so a slot waiting for its answer (which names its exchange) makes no cycle.
"""

from __future__ import annotations

import collections
import time
import uuid
from typing import TYPE_CHECKING

from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.framing import Frame
from kvproxy.protocol.headers import RequestHeader
from kvproxy.protocol.messages import PRODUCE, Request
from kvproxy.proxy.produce.engine import ProduceDecision, ProduceEngine
from kvproxy.proxy.produce.many_partitions import decide_unread, read_unless_many
from kvproxy.proxy.produce.request_scan import DECODE_BUDGET
from kvproxy.proxy.relay.close_reasons import CloseReason, PauseReason
from kvproxy.proxy.relay.response_slots import Slot

if TYPE_CHECKING:
    from kvproxy.proxy.relay.client_connection import ClientConnection


class ProduceExchange:
    """One Produce request: decided (on the loop or in a task), routed, its answer merged."""

    __slots__ = ("_engine", "_started", "decision", "held")

    def __init__(self, engine: ProduceEngine) -> None:
        self._engine = engine
        """The rules in force when the request was read: a reload meanwhile changes nothing."""
        self._started = time.perf_counter()
        self.decision: ProduceDecision | None = None
        self.held: collections.deque[Frame] = collections.deque()
        """The connection's requests read while this one is decided in a task, in order."""

    def start(self, client: ClientConnection, payload: Frame) -> None:
        """Decide on the loop when that is cheap; otherwise hold `client`'s later requests and
        decide in a task."""
        decisions = client.state.decisions
        # malformed: DecodeError ends the connection
        request = read_unless_many(payload, self._engine.settings.inline_max_partitions)
        ids: list[uuid.UUID] = []
        unknown: list[str] = []
        if request is not None:
            request, ids = decisions.name_topics(request, client)  # v13: topics by id
            unknown = decisions.topics_to_describe(request, client)
        if request is not None and not unknown and not ids:
            decision = decisions.decide_now(self._engine, payload, request)
            if decision is not None:
                self._apply(client, request.header, decision)
                return
        client.deciding = self
        client.pause_reading(PauseReason.PRODUCE)
        client.spawn(self._decide_later(client, payload, request, unknown, ids))

    async def _decide_later(
        self,
        client: ClientConnection,
        payload: Frame,
        request: Request | None,
        topics: list[str],
        ids: list[uuid.UUID],
    ) -> None:
        """Describe the topics and look up the schema ids the checks need, then decide (on the
        loop if it is cheap, else on the decoding thread); then hand back the requests held
        meanwhile, in order."""
        decisions = client.state.decisions
        try:
            if request is None:  # many partitions: read off the loop too (`partition_limit`)
                header, decision = await decide_unread(decisions, self._engine, payload, client)
            else:
                header = request.header
                if ids:  # names of v13 topic ids asked first, then their settings described
                    request, more = await decisions.name_after_asking(request, ids, client)
                    topics = list(dict.fromkeys([*topics, *more]))
                decision = await decisions.decide_later(self._engine, payload, request, topics)
        except ProtocolError as exc:
            client.abort_undecodable(exc)
            return
        client.deciding = None
        held = self.held
        try:
            self._apply(client, header, decision)
            while held and client.deciding is None:
                client.on_request(held.popleft())
        except ProtocolError as exc:
            client.abort_undecodable(exc)
            return
        if held and client.deciding is not None:
            client.deciding.held.extendleft(reversed(held))  # blocked again: keep the order
        if client.deciding is None:
            client.resume_reading(PauseReason.PRODUCE)
            client.flush()

    def _apply(
        self, client: ClientConnection, header: RequestHeader, decision: ProduceDecision
    ) -> None:
        """Record the refusals and count the outcome, then route the request."""
        self.decision = decision
        state = client.state
        metrics = state.metrics
        state.sink.record(decision, header.client_id, client.peer)
        outcome = "forwarded"
        if decision.rejected:
            outcome = "rejected" if decision.forward is None else "partially_rejected"
            refused = sum(1 for o in decision.rejected if o.verdict.policy == DECODE_BUDGET)
            if refused:
                metrics.decode_budget_refusals.inc(refused)
        metrics.child(metrics.requests, "produce", outcome).inc()
        try:
            self._route(client, decision, header.correlation_id, header.api_version)
        finally:
            metrics.proxy_latency.observe(time.perf_counter() - self._started)

    def _route(
        self, client: ClientConnection, decision: ProduceDecision, correlation_id: int, version: int
    ) -> None:
        """What passed goes upstream; the client is answered when the broker is, or at once
        when nothing passed (acks=0: never, and a refusal closes the connection)."""
        if decision.acks == 0:
            if decision.forward is not None:
                silent = Slot(correlation_id, PRODUCE, version, silent=True)
                client.send_upstream(silent, decision.forward)
            if decision.rejected:
                client.abort(
                    f"acks=0 produce request from {client.peer} rejected: closing the connection "
                    "as a broker does",
                    reason=CloseReason.ACKS0_REJECTION,
                )
            return
        slot = Slot(correlation_id, PRODUCE, version)
        slot.exchange = self
        if decision.forward is None:
            slot.payload = decision.answer(None)
            client.answer_locally(slot)
            return
        slot.sent_at = time.perf_counter()  # the broker's time is measured for Produce
        client.forward(slot, decision.forward)

    def merged(self, upstream: Frame) -> Frame:
        """The broker's answer, merged with the proxy's own errors when it refused partitions,
        under the rules the request was judged by (a reload meanwhile changes neither)."""
        decision = self.decision
        if decision is None:
            return upstream
        decision.observe(upstream)
        if not decision.needs_merge:
            return upstream
        return decision.answer(upstream)
