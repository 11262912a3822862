"""Response slots: each client connection's FIFO of requests awaiting their answers.

A client connection keeps one slot per request that expects an answer; an answer (from the
broker, rewritten or not, or made by the proxy itself) fills its slot, and slots leave strictly
in request order. acks=0 Produce requests get a `silent` slot on the upstream FIFO only, in case
the broker answers them anyway (Tansu does, Kafka does not).
"""

from __future__ import annotations

import collections
from typing import Protocol

from kvproxy.protocol.errors import ProtocolError, UnsupportedVersion
from kvproxy.protocol.framing import Frame
from kvproxy.protocol.messages import PRODUCE, decode_response


class MergesAnswer(Protocol):
    """What answers a Produce request: the broker's answer merged with the proxy's refusals."""

    def merged(self, upstream: Frame) -> Frame: ...


class Slot:
    """One request waiting for its answer; `payload` is the answer frame once known."""

    __slots__ = (
        "api_key",
        "api_version",
        "correlation_id",
        "exchange",
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
        self.exchange: MergesAnswer | None = None
        """A Produce request's exchange, which merges the broker's answer with its refusals."""
        self.sent_at = 0.0
        self.silent = silent
        """An acks=0 Produce: the client expects no answer, so one from the broker is dropped."""


MAX_SILENT_SLOTS = 10_000
"""acks=0 requests remembered per connection in case the broker answers them (Tansu does; Kafka
never does): past this many, the oldest is forgotten, so a client sending only acks=0 requests
holds a bounded amount of memory."""


def answers_silent(awaiting: collections.deque[Slot], silent: Slot, payload: Frame) -> bool | None:
    """Whether an answer carrying an acks=0 request's correlation id is that request's.

    Usually yes (Tansu answers acks=0 requests; Kafka does not). But ids need not be unique:
    when a later request awaiting its answer has the same id, the answer is the acks=0
    request's only if it decodes as its Produce answer, the later request's only if it
    decodes as that one's; None when it decodes as both (the caller closes: never guess)."""
    later = next(
        (
            slot
            for slot in awaiting
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
