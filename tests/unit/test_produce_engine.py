"""`proxy.produce.ProduceEngine` on whole Produce requests, without sockets: which rules a decision
is answered under, and the request-level refusal of transactional batches without a
transactional id."""

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


# ---- a transactional batch without a transactional id ----

AUTHORIZATION_FAILED = error_codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def transactional(value: bytes) -> bytes:
    return batch(value, producer_id=5, producer_epoch=0, base_sequence=0, is_transactional=True)


@pytest.mark.parametrize("version", [2, 3, 8, 9, 12])
def test_every_partition_is_refused_when_a_first_batch_is_transactional_without_an_id(
    version: int,
) -> None:
    """KafkaApis.handleProduceRequest refuses the whole request, before any other check, with
    ProduceRequest.getErrorResponse: every partition 53, no error message (the exception's
    text is the code's own), no record errors, base offset -1; on every version (the code is the
    broker's answer, not a record rejection the legacy code stands for)."""
    chosen = engine(ErrorProfile.KAFKA)
    parts = [
        (TOPIC, 0, batch(b"not json")),
        (TOPIC, 1, transactional(b"[1]")),
        ("other", 0, b"\x00\x01not a batch"),
    ]
    decision = decide(chosen, version, parts)
    sent = {(topic, partition): records for topic, partition, records in parts}
    assert decision.forward is None
    assert [(o.topic, o.index) for o in decision.rejected] == [(TOPIC, 0), (TOPIC, 1), ("other", 0)]
    for outcome in decision.rejected:
        assert outcome.verdict.code == AUTHORIZATION_FAILED
        assert outcome.verdict.policy == "transactional_id"
        assert outcome.verdict.message == "Transactional Id authorization failed."
        assert bytes(outcome.raw) == sent[(outcome.topic, outcome.index)]
    body = decode_response(decision.answer(None), PRODUCE, version).body
    answers = [(str(t.name), p) for t in body.responses for p in t.partition_responses]
    assert [(name, int(p.index)) for name, p in answers] == [(TOPIC, 0), (TOPIC, 1), ("other", 0)]
    for _, partition in answers:
        assert int(partition.error_code) == AUTHORIZATION_FAILED
        assert int(partition.base_offset) == -1
        assert getattr(partition, "error_message", None) is None
        assert list(getattr(partition, "record_errors", ())) == []


def test_the_refusal_comes_before_the_acks_check_and_the_record_limit() -> None:
    chosen = engine(ErrorProfile.KIP, max_records_per_request=1)
    parts = [(TOPIC, 0, transactional(b"[1]")), (TOPIC, 1, batch(b"[2]"))]
    decision = decide(chosen, 9, parts, acks=5)
    assert [o.verdict.code for o in decision.outcomes] == [AUTHORIZATION_FAILED] * 2


def test_a_transactional_id_or_a_later_transactional_batch_is_not_refused_by_it() -> None:
    """With a transactional id the request goes on to the checks (the broker's coordinator
    checks the rest); Kafka looks at the first batch of each partition only, so a transactional
    batch after a plain one is left to `batch_integrity` (one batch per partition on v3+)."""
    chosen = engine(ErrorProfile.KAFKA)
    decision = decide(chosen, 9, [(TOPIC, 0, transactional(b"[1]"))], transactional_id="tx")
    assert decision.rejected == () and decision.forward is not None
    decision = decide(chosen, 9, [(TOPIC, 0, transactional(b"[1]"))], transactional_id="")
    assert decision.rejected == ()
    second = batch(b"[1]") + transactional(b"[2]")
    decision = decide(chosen, 9, [(TOPIC, 0, second)])
    [outcome] = decision.rejected
    assert (outcome.verdict.code, outcome.verdict.policy) == (
        error_codes.INVALID_RECORD,
        "batch_integrity",
    )


def test_no_batch_at_all_is_not_transactional() -> None:
    chosen = engine(ErrorProfile.KAFKA)
    decision = decide(chosen, 9, [(TOPIC, 0, None), (TOPIC, 1, b"")])
    assert {o.verdict.policy for o in decision.rejected} == {"batch_integrity"}
