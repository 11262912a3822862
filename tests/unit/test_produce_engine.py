"""`proxy.produce.ProduceEngine` on whole Produce requests, without sockets: which rules a decision
is answered under."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from policies.config import build_routing
from protocol import error_codes
from protocol.error_codes import ErrorProfile
from protocol.messages import (
    PRODUCE,
    decode_request,
    decode_response,
    encode_response,
    make_response,
)
from protocol.produce import partition_answer, produce_answer, produce_response_types
from protocol.records import build_batch
from proxy.produce import ProduceDecision, ProduceEngine, ProduceSettings
from tests.harness.fuzz import produce_request

TOPIC = "orders"
JSON_ONLY = {"policies": ["batch_integrity", "crc", "json"]}


def engine(profile: ErrorProfile, **settings: Any) -> ProduceEngine:
    routing = build_routing(None, [{"match": TOPIC, **JSON_ONLY}], Path("."))
    return ProduceEngine(routing, ProduceSettings(profile=profile, **settings), lambda _: False)


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


def answered(decision: ProduceDecision, upstream: bytes | None) -> dict[int, Any]:
    body = decode_response(decision.answer(upstream), PRODUCE, decision.api_version).body
    return {int(p.index): p for t in body.responses for p in t.partition_responses}


# ---- a decision is answered under the rules it was judged by ----


@pytest.mark.parametrize(
    ("judged_under", "code"),
    [
        (ErrorProfile.KAFKA, error_codes.INVALID_RECORD),
        (ErrorProfile.KIP, error_codes.KIP_INVALID_RECORD),
    ],
)
def test_a_decision_is_answered_with_the_engine_that_judged_it(
    judged_under: ErrorProfile, code: int
) -> None:
    """Two engines with different error profiles, as before and after a reload: the answer to a
    request judged by one is built by that one, whichever is current when the broker answers."""
    judge = engine(judged_under)
    current = engine(ErrorProfile.KIP if judged_under is ErrorProfile.KAFKA else ErrorProfile.KAFKA)
    decision = decide(judge, 9, [(TOPIC, 0, batch(b"not json")), (TOPIC, 1, batch(b"[1]"))])
    assert decision.engine is judge and decision.engine is not current
    assert decision.forward is not None  # partition 1 goes to the broker
    answers = answered(decision, broker_answer(9, [1]))
    assert (int(answers[0].error_code), int(answers[1].error_code)) == (code, 0)
    assert judge.answer(decision, broker_answer(9, [1])) == decision.answer(broker_answer(9, [1]))
