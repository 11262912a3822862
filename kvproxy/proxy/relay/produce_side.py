"""What a Produce request's exchange sees of its client connection (`ProduceClient`).

While a Produce request is decided in a task, the requests read after it wait here, in order,
and are handed back to the connection once it is decided (their answers must follow its). The
exchange's routing becomes the connection's slots here: upstream with the exchange merging the
broker's answer, answered locally, or silent (acks=0).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.fast_accept import Accepted
from kvproxy.protocol.framing import Frame
from kvproxy.protocol.messages import PRODUCE
from kvproxy.proxy.ops.metrics import ProxyMetrics
from kvproxy.proxy.produce.decider import ProduceDecider
from kvproxy.proxy.produce.decision import ProduceDecision
from kvproxy.proxy.produce.exchange import ProduceExchange
from kvproxy.proxy.relay.close_reasons import CloseReason, PauseReason
from kvproxy.proxy.relay.connection_state import ConnectionState
from kvproxy.proxy.relay.response_slots import Slot


class _Connection(Protocol):
    """The client connection's calls this side makes."""

    peer: str
    held: collections.deque[Frame] | None
    state: ConnectionState
    metrics: ProxyMetrics

    def on_request(self, payload: Frame) -> None: ...
    def forward(self, slot: Slot, payload: Frame) -> None: ...
    def answer_locally(self, slot: Slot) -> None: ...
    def send_upstream(self, slot: Slot, payload: Frame) -> None: ...
    def pause_reading(self, reason: PauseReason) -> None: ...
    def resume_reading(self, reason: PauseReason) -> None: ...
    def flush(self) -> None: ...
    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> Any: ...
    def abort_undecodable(self, exc: ProtocolError) -> None: ...
    def abort(
        self, why: str, level: int = logging.WARNING, *, reason: CloseReason | None = None
    ) -> None: ...


def forward_accepted(
    connection: _Connection, accepted: Accepted, payload: Frame, started: float
) -> None:
    """A request the compiled fast accept passed whole: counted as the Python path counts an
    accepted request, and forwarded as its own bytes (the broker's answer passes through)."""
    slot = Slot(accepted[1], PRODUCE, accepted[0])
    slot.sent_at = now = time.perf_counter()
    connection.metrics.accepted.count(accepted[3], now - started)
    connection.forward(slot, payload)


class ProduceSide:
    """A connection's side of one Produce exchange: held requests, slots, refusals.

    Made for each exchange, so that the connection holds no reference back to it: a closed
    connection is freed at once, not by the cycle collector."""

    __slots__ = ("_connection",)

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    @property
    def connection(self) -> object:
        return self._connection

    @property
    def peer(self) -> str:
        return self._connection.peer

    @property
    def metrics(self) -> ProxyMetrics:
        return self._connection.metrics

    @property
    def decider(self) -> ProduceDecider:
        return self._connection.state.decisions

    def record_refusals(self, decision: ProduceDecision, client_id: str | None) -> None:
        self._connection.state.sink.record(decision, client_id, self.peer)

    def hold_requests(self) -> None:
        if self._connection.held is None:
            self._connection.held = collections.deque()
        self._connection.pause_reading(PauseReason.PRODUCE)

    def release_requests(self) -> None:
        connection = self._connection
        held, connection.held = connection.held, None
        try:
            while held:
                connection.on_request(held.popleft())
                if connection.held is not None:  # decided in a task again: the rest wait first
                    connection.held.extendleft(reversed(held))
                    return
        except ProtocolError as exc:
            connection.abort_undecodable(exc)
            return
        connection.resume_reading(PauseReason.PRODUCE)
        connection.flush()

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> Any:
        return self._connection.spawn(coroutine)

    def produce_upstream(
        self, exchange: ProduceExchange, correlation_id: int, version: int, forward: Frame
    ) -> None:
        slot = Slot(correlation_id, PRODUCE, version)
        slot.exchange = exchange
        slot.sent_at = time.perf_counter()  # the broker's time is measured for Produce
        self._connection.forward(slot, forward)

    def produce_answered(
        self, exchange: ProduceExchange, correlation_id: int, version: int, answer: bytes
    ) -> None:
        slot = Slot(correlation_id, PRODUCE, version)
        slot.exchange = exchange
        slot.payload = answer
        self._connection.answer_locally(slot)

    def produce_silent(self, correlation_id: int, version: int, forward: Frame | None) -> None:
        if forward is not None:
            slot = Slot(correlation_id, PRODUCE, version, silent=True)
            self._connection.send_upstream(slot, forward)

    def close_after_silent_refusal(self) -> None:
        self._connection.abort(
            f"acks=0 produce request from {self.peer} rejected: closing the connection as a "
            "broker does",
            reason=CloseReason.ACKS0_REJECTION,
        )

    def abort_undecodable(self, exc: ProtocolError) -> None:
        self._connection.abort_undecodable(exc)
