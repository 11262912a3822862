"""One Produce request, from the decision of the policies to the answer the client gets.

A `ProduceExchange` is made for each Produce request a client connection reads (as uvicorn's
`RequestResponseCycle` for an HTTP request) and owns it from then on, in one direction: it
decides on the event loop when that is cheap; otherwise it asks its connection to hold the
requests read after it (their answers must follow this one's), decides in a task (topics
described, schema ids looked up, on the decoding thread if costly) and lets the connection go
on. Decided, it has the refusals recorded, routes what passed and, when the broker answers,
merges that answer with the proxy's own errors.

It talks to its connection only through `ProduceClient`, the few calls an exchange makes: the
exchange never re-enters the connection's request handling nor sets its fields. The connection
is an argument of the steps that need it, so a slot waiting for its answer (which names its
exchange) makes no cycle.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Coroutine
from typing import Any, Protocol

from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.framing import Frame
from kvproxy.protocol.headers import RequestHeader
from kvproxy.protocol.messages import Request
from kvproxy.protocol.request_view import RequestView
from kvproxy.proxy.ops.metrics import ProxyMetrics
from kvproxy.proxy.produce.decider import ProduceDecider
from kvproxy.proxy.produce.decision import ProduceDecision
from kvproxy.proxy.produce.engine import ProduceEngine
from kvproxy.proxy.produce.many_partitions import (
    WholeRequestRefusal,
    read_many,
    read_unless_many,
)


class ProduceClient(Protocol):
    """What an exchange asks of the client connection it serves."""

    @property
    def peer(self) -> str: ...

    @property
    def metrics(self) -> ProxyMetrics: ...

    @property
    def decider(self) -> ProduceDecider: ...

    @property
    def connection(self) -> object:
        """The connection whose lookups are budgeted (held weakly by the budgets)."""

    def record_refusals(self, decision: ProduceDecision, client_id: str | None) -> None:
        """Log, count, keep and copy the decision's refusals (`RejectionSink.record`)."""

    def hold_requests(self) -> None:
        """Keep the requests read from now on until `release_requests` (in order)."""

    def release_requests(self) -> None:
        """Handle the requests held meanwhile, in order, and read again."""

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> Any:
        """Run `coroutine` as the connection's task (cancelled when it closes)."""

    def produce_upstream(
        self, exchange: ProduceExchange, correlation_id: int, version: int, forward: Frame
    ) -> None:
        """Send what passed upstream; the answer, when it comes, is the exchange's to merge."""

    def produce_answered(
        self, exchange: ProduceExchange, correlation_id: int, version: int, answer: bytes
    ) -> None:
        """Queue the proxy's own answer, in line with the others."""

    def produce_silent(self, correlation_id: int, version: int, forward: Frame | None) -> None:
        """An acks=0 request: send what passed, expect no answer."""

    def close_after_silent_refusal(self) -> None:
        """An acks=0 request was refused: close the connection, as a broker does."""

    def abort_undecodable(self, exc: ProtocolError) -> None:
        """The request's bytes are not Kafka's: end the connection."""


class ProduceExchange:
    """One Produce request: decided (on the loop or in a task), routed, its answer merged."""

    __slots__ = ("_engine", "_started", "decision")

    def __init__(self, engine: ProduceEngine) -> None:
        self._engine = engine
        """The rules in force when the request was read: a reload meanwhile changes nothing."""
        self._started = time.perf_counter()
        self.decision: ProduceDecision | None = None

    def start(self, client: ProduceClient, view: RequestView) -> None:
        """Decide on the loop when that is cheap; otherwise have `client` hold its later
        requests and decide in a task."""
        decider = client.decider
        # malformed: DecodeError ends the connection
        request = read_unless_many(view, self._engine.settings.inline_max_partitions)
        ids: list[uuid.UUID] = []
        unknown: list[str] = []
        if request is not None:
            request, ids = decider.name_topics(request, client.connection)  # v13: topics by id
            unknown = decider.topics_to_describe(request, client.connection)
        if request is not None and not unknown and not ids:
            decision = decider.decide_now(self._engine, view.frame, request)
            if decision is not None:
                self._apply(client, request.header, decision)
                return
        client.hold_requests()
        client.spawn(self._decide_later(client, view, request, unknown, ids))

    async def _decide_later(
        self,
        client: ProduceClient,
        view: RequestView,
        request: Request | None,
        topics: list[str],
        ids: list[uuid.UUID],
    ) -> None:
        """Describe the topics and look up the schema ids the checks need, then decide (on the
        loop if it is cheap, else on the decoding thread); then let the connection go on."""
        decider = client.decider
        try:
            if request is None:  # many partitions: read off the loop too (`many_partitions`)
                read = await self._read_many(decider, view)
                if isinstance(read, WholeRequestRefusal):
                    self._decided(client, view.header[0], read)
                    return
                request, ids = decider.name_topics(read, client.connection)
                topics = decider.topics_to_describe(request, client.connection)
            if ids:  # names of v13 topic ids asked first, then their settings described
                request, more = await decider.name_after_asking(request, ids, client.connection)
                topics = list(dict.fromkeys([*topics, *more]))
            decision = await decider.decide_later(self._engine, view.frame, request, topics)
        except ProtocolError as exc:
            client.abort_undecodable(exc)
            return
        self._decided(client, request.header, decision)

    async def _read_many(
        self, decider: ProduceDecider, view: RequestView
    ) -> WholeRequestRefusal | Request:
        """`read_many` on the decoding thread, under the partitions limit."""
        limits = decider.config.limits
        limit, max_answer = limits.max_partitions_per_request, limits.max_frame_bytes
        return await decider.off_loop(lambda: read_many(view, self._engine, limit, max_answer))

    def _decided(
        self, client: ProduceClient, header: RequestHeader, decision: ProduceDecision
    ) -> None:
        """A decision made in a task: applied, then the connection goes on."""
        try:
            self._apply(client, header, decision)
        except ProtocolError as exc:
            client.abort_undecodable(exc)
            return
        client.release_requests()

    def _apply(
        self, client: ProduceClient, header: RequestHeader, decision: ProduceDecision
    ) -> None:
        """Record the refusals and count the outcome, then route the request."""
        self.decision = decision
        metrics = client.metrics
        client.record_refusals(decision, header.client_id)
        outcome = "forwarded"
        if decision.rejected:
            outcome = "rejected" if decision.forward is None else "partially_rejected"
            if decision.unchecked:
                metrics.decode_budget_refusals.inc(decision.unchecked)
        metrics.child(metrics.requests, "produce", outcome).inc()
        metrics.child(metrics.decided, "python").inc()
        try:
            self._route(client, decision, header.correlation_id, header.api_version)
        finally:
            metrics.proxy_latency.observe(time.perf_counter() - self._started)

    def _route(
        self, client: ProduceClient, decision: ProduceDecision, correlation_id: int, version: int
    ) -> None:
        """What passed goes upstream; the client is answered when the broker is, or at once
        when nothing passed (acks=0: never, and a refusal closes the connection)."""
        if decision.acks == 0:
            client.produce_silent(correlation_id, version, decision.forward)
            if decision.rejected:
                client.close_after_silent_refusal()
        elif decision.forward is None:
            client.produce_answered(
                self, correlation_id, version, self._engine.answers.answer(decision, None)
            )
        else:
            client.produce_upstream(self, correlation_id, version, decision.forward)

    def merged(self, upstream: Frame) -> Frame:
        """The broker's answer, merged with the proxy's own errors when it refused partitions,
        under the rules the request was judged by (a reload meanwhile changes neither)."""
        decision = self.decision
        if decision is None:
            return upstream
        self._engine.answers.observe(decision, upstream)
        if not decision.needs_merge:
            return upstream
        return self._engine.answers.answer(decision, upstream)
