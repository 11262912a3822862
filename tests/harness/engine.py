"""Driving `kvproxy.proxy.produce.engine.ProduceEngine` without sockets: a one-record batch, a
decision on a whole Produce request, the broker's answer to what was forwarded, and the
client's answer built by the engine that judged the request (as its `ProduceExchange` keeps
it: a decision holds no engine)."""

from __future__ import annotations

from typing import Any

from kvproxy.protocol.messages import PRODUCE, decode_request, encode_response, make_response
from kvproxy.protocol.produce import partition_answer, produce_answer, produce_response_types
from kvproxy.protocol.records import build_batch
from kvproxy.proxy.produce.decision import ProduceDecision
from kvproxy.proxy.produce.engine import ProduceEngine
from tests.harness.fuzz import produce_request

TOPIC = "orders"


def batch(value: bytes, **options: Any) -> bytes:
    return build_batch([(b"k", value, None, None)], **options)


_JUDGES: dict[int, tuple[ProduceDecision, ProduceEngine]] = {}
"""Each decision made here, with its engine (the decision is kept, so its id is not reused)."""


def judged_by(decision: ProduceDecision, engine: ProduceEngine) -> ProduceDecision:
    """`decision`, remembered as `engine`'s, for `answer_of` and `observe`."""
    _JUDGES[id(decision)] = (decision, engine)
    return decision


def answer_of(decision: ProduceDecision, upstream: bytes | None) -> bytes:
    """The client's answer, as the exchange builds it with the engine that judged."""
    return _JUDGES[id(decision)][1].answers.answer(decision, upstream)


def observe(decision: ProduceDecision, upstream: bytes) -> None:
    """The broker's answer shown to the observing policies, as the exchange shows it."""
    _JUDGES[id(decision)][1].answers.observe(decision, upstream)


def decide(chosen: ProduceEngine, version: int, parts: list[Any], **options: Any) -> Any:
    frame = produce_request(version, 9, parts, **options)
    return judged_by(chosen.decide(frame, decode_request(frame)), chosen)


def broker_answer(version: int, partitions: list[int]) -> bytes:
    """What a broker answers for the forwarded partitions of TOPIC: success for each."""
    types = produce_response_types(version)
    body = produce_answer(types, [(TOPIC, [partition_answer(types, p, 0) for p in partitions])])
    return encode_response(PRODUCE, version, make_response(PRODUCE, version, 9, body))
