"""Driving `kvproxy.proxy.produce.engine.ProduceEngine` without sockets: a one-record batch, a
decision on
a
whole Produce request, and the broker's answer to what was forwarded."""

from __future__ import annotations

from typing import Any

from kvproxy.protocol.messages import PRODUCE, decode_request, encode_response, make_response
from kvproxy.protocol.produce import partition_answer, produce_answer, produce_response_types
from kvproxy.protocol.records import build_batch
from kvproxy.proxy.produce.engine import ProduceEngine
from tests.harness.fuzz import produce_request

TOPIC = "orders"


def batch(value: bytes, **options: Any) -> bytes:
    return build_batch([(b"k", value, None, None)], **options)


def decide(chosen: ProduceEngine, version: int, parts: list[Any], **options: Any) -> Any:
    frame = produce_request(version, 9, parts, **options)
    return chosen.decide(frame, decode_request(frame))


def broker_answer(version: int, partitions: list[int]) -> bytes:
    """What a broker answers for the forwarded partitions of TOPIC: success for each."""
    types = produce_response_types(version)
    body = produce_answer(types, [(TOPIC, [partition_answer(types, p, 0) for p in partitions])])
    return encode_response(PRODUCE, version, make_response(PRODUCE, version, 9, body))
