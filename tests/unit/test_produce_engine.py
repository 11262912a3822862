"""`kvproxy.proxy.produce.engine.ProduceEngine` on whole Produce requests, without sockets: what
goes
upstream,
the answer merged from the local refusals and the broker's answer (in request order, with the code
and details each Produce version gets), the modes, `reject: request`, acks=0, the error profiles,
the record limit, the request-level refusal of transactional batches without a transactional id,
which rules a decision is answered under, and the producer state fed from the broker's answer.

The integration tests (`test_policies_answers`, `test_policies_edges`, `test_limits`) check the
same answers through a running proxy and Tansu; these pin them on the engine alone."""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path
from typing import Any

import pytest

from kvproxy.policies.config import build_routing
from kvproxy.protocol import error_codes
from kvproxy.protocol.error_codes import ErrorProfile
from kvproxy.protocol.messages import (
    PRODUCE,
    decode_request,
    decode_response,
    encode_response,
    make_response,
)
from kvproxy.protocol.produce import partition_answer, produce_answer, produce_response_types
from kvproxy.protocol.records import build_batch
from kvproxy.proxy.produce.decision import ProduceDecision, ProduceSettings
from kvproxy.proxy.produce.engine import ProduceEngine
from tests.harness.engine import TOPIC, answer_of, batch, broker_answer, decide, judged_by
from tests.harness.fuzz import produce_request
from tests.harness.produce import (
    ANOTHER_PARTITION,
    JSON_ONLY,
    compacted_message,
    kafka_message,
    record_errors,
)


def engine(profile: ErrorProfile, **settings: Any) -> ProduceEngine:
    routing = build_routing(None, [{"match": TOPIC, **JSON_ONLY}], Path("."))
    return ProduceEngine(routing, ProduceSettings(profile=profile, **settings), lambda _: False)


def answered(decision: ProduceDecision, upstream: bytes | None) -> dict[int, Any]:
    body = decode_response(answer_of(decision, upstream), PRODUCE, decision.api_version).body
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
    assert decision.forward is not None  # partition 1 goes to the broker
    answers = answered(decision, broker_answer(9, [1]))
    assert (int(answers[0].error_code), int(answers[1].error_code)) == (code, 0)
    upstream = broker_answer(9, [1])
    assert answer_of(decision, upstream) == judge.answers.answer(decision, upstream)
    assert current.answers.answer(decision, upstream) != judge.answers.answer(decision, upstream)


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
    body = decode_response(answer_of(decision, None), PRODUCE, version).body
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


def test_the_transactional_test_reads_no_batch_already_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first batch of each partition is the one its checks read: not read again (only a
    partition whose batches did not parse is read for it), and still found transactional."""
    from kvproxy.proxy.produce import request_scan as produce_scan

    reads: list[object] = []
    original = produce_scan.read_batch

    def counted(records: Any) -> Any:
        reads.append(records)
        return original(records)

    monkeypatch.setattr(produce_scan, "read_batch", counted)
    chosen = engine(ErrorProfile.KAFKA)
    decision = decide(chosen, 9, [(TOPIC, 0, batch(b"[1]")), (TOPIC, 1, batch(b"[2]"))])
    assert decision.rejected == () and reads == []
    parts = [(TOPIC, 0, b"\x00\x01not a batch"), (TOPIC, 1, transactional(b"[1]"))]
    decision = decide(chosen, 9, parts)
    assert [o.verdict.code for o in decision.outcomes] == [AUTHORIZATION_FAILED] * 2
    assert len(reads) == 1  # the partition that did not parse


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


# ---- helpers of the tests below: any routing, the forwarded request, the whole answer ----

OTHER = "payments"
GOOD, BAD = b'{"id": 1}', b"not json"
NOT_JSON = "Record value is not valid JSON (invalid literal, expected 'null': line 1 column 1)"
MESSAGE_TOO_LARGE = error_codes.MESSAGE_TOO_LARGE
INVALID_RECORD = error_codes.INVALID_RECORD
CORRUPT_MESSAGE = error_codes.CORRUPT_MESSAGE
"""The legacy code: what Produce v0-v2 clients get for a record rejection by default."""


def routed(
    defaults: dict[str, Any] | None = JSON_ONLY,
    topics: list[dict[str, Any]] | None = None,
    *,
    compacted: bool = False,
    **settings: Any,
) -> ProduceEngine:
    """An engine over the YAML's `defaults` and `topics` sections, with `ProduceSettings`."""
    routing = build_routing(defaults, topics, Path("."))
    return ProduceEngine(routing, ProduceSettings(**settings), lambda _: compacted)


def magic_for(version: int) -> int:
    """The message format a client sends in Produce `version` (v3+ carry magic 2 only)."""
    return 0 if version < 2 else 1 if version == 2 else 2


def records(version: int, *values: bytes, key: bytes | None = b"k") -> bytes:
    return build_batch([(key, value, None, None) for value in values], magic=magic_for(version))


def judged(
    chosen: ProduceEngine, version: int, parts: list[Any], **options: Any
) -> tuple[bytes, ProduceDecision]:
    """The request frame and the engine's decision on it."""
    frame = produce_request(version, 9, parts, **options)
    return frame, judged_by(chosen.decide(frame, decode_request(frame)), chosen)


def forwarded(decision: ProduceDecision) -> list[tuple[str, int, bytes]]:
    """(topic, partition, records) of the request that goes upstream."""
    assert decision.forward is not None
    body = decode_request(decision.forward).body
    return [
        (str(topic.name), int(data.index), bytes(data.records))
        for topic in body.topic_data
        for data in topic.partition_data
    ]


def broker_accepts(forward: bytes, code: int = 0, throttle_ms: int = 250) -> bytes:
    """A broker's answer to `forward`: `code` for each partition, base offsets 100, 101, ... in
    request order, and a throttle time (Produce v1+)."""
    from kio.static.primitive import i32Timedelta, i64

    request = decode_request(forward)
    version = request.header.api_version
    types = produce_response_types(version)
    offsets = iter(range(100, 1000))
    topics = [
        (
            str(topic.name),
            [
                dataclasses.replace(
                    partition_answer(types, int(data.index), code), base_offset=i64(next(offsets))
                )
                for data in topic.partition_data
            ],
        )
        for topic in request.body.topic_data
    ]
    body = produce_answer(types, topics)
    if version >= 1:
        throttle = i32Timedelta.parse(datetime.timedelta(milliseconds=throttle_ms))
        body = dataclasses.replace(body, throttle_time=throttle)
    response = make_response(PRODUCE, version, request.header.correlation_id, body)
    return encode_response(PRODUCE, version, response)


def in_order(decision: ProduceDecision, upstream: bytes | None) -> tuple[Any, list[Any]]:
    """The client's answer: its body, and ((topic, partition), answer) in the answer's order."""
    body = decode_response(answer_of(decision, upstream), PRODUCE, decision.api_version).body
    answers = [
        ((str(topic.name), int(p.index)), p)
        for topic in body.responses
        for p in topic.partition_responses
    ]
    return body, answers


def three_partitions(version: int) -> list[Any]:
    """A valid partition, an invalid one, and a valid one of another topic."""
    return [
        (TOPIC, 0, records(version, GOOD)),
        (TOPIC, 1, records(version, BAD)),
        (OTHER, 0, records(version, b"[2]")),
    ]


# ---- all accepted: the original bytes go upstream ----


@pytest.mark.parametrize("reject_request", [False, True])
@pytest.mark.parametrize("version", [0, 2, 3, 8, 9, 12])
def test_an_accepted_request_goes_upstream_as_the_client_sent_it(
    version: int, reject_request: bool
) -> None:
    parts = [
        (TOPIC, 0, records(version, GOOD)),
        (TOPIC, 1, records(version, b"[1]", b"2")),
        (OTHER, 0, records(version, b'"three"')),
    ]
    frame, decision = judged(routed(reject_request=reject_request), version, parts)
    assert decision.forward is frame  # not re-encoded
    assert decision.rejected == () and decision.warned == () and not decision.needs_merge
    assert [(o.topic, o.index, o.verdict.ok, o.enforced) for o in decision.outcomes] == [
        (TOPIC, 0, True, True),
        (TOPIC, 1, True, True),
        (OTHER, 0, True, True),
    ]
    assert [bytes(o.raw) for o in decision.outcomes] == [records for _, _, records in parts]


# ---- reject: partition (the default) ----


@pytest.mark.parametrize("version", [0, 2, 3, 7, 8, 9, 12])
def test_a_refused_partition_is_left_out_of_the_forwarded_request(version: int) -> None:
    """The rest goes upstream re-encoded with the client's header, acks, timeout and
    transactional id, and each partition's records exactly as the client sent them."""
    parts = three_partitions(version)
    frame, decision = judged(routed(), version, parts)
    assert [(o.topic, o.index) for o in decision.rejected] == [(TOPIC, 1)]
    assert decision.needs_merge
    assert forwarded(decision) == [(TOPIC, 0, parts[0][2]), (OTHER, 0, parts[2][2])]
    assert decision.forward is not None
    sent, kept = decode_request(frame), decode_request(decision.forward)
    assert kept.header == sent.header
    assert dataclasses.replace(kept.body, topic_data=sent.body.topic_data) == sent.body


@pytest.mark.parametrize(
    ("version", "code"),
    [(0, CORRUPT_MESSAGE), (2, CORRUPT_MESSAGE), (3, INVALID_RECORD), (7, INVALID_RECORD)]
    + [(v, INVALID_RECORD) for v in (8, 9, 12)],
)
def test_the_merged_answer_puts_the_local_error_in_request_order(version: int, code: int) -> None:
    """test_partition_rejection_merges_with_the_broker_answer_in_every_version, on the engine:
    the broker's answers for the forwarded partitions (their offsets, its throttle time) and the
    local refusal where the client put that partition; v8+ add the record errors and Kafka's
    message, earlier versions carry the code alone (v0-v2: the legacy code)."""
    _, decision = judged(routed(), version, three_partitions(version))
    assert decision.forward is not None
    body, answers = in_order(decision, broker_accepts(decision.forward))
    assert [key for key, _ in answers] == [(TOPIC, 0), (TOPIC, 1), (OTHER, 0)]
    assert [int(p.error_code) for _, p in answers] == [0, code, 0]
    assert [int(p.base_offset) for _, p in answers] == [100, -1, 101]
    if version >= 1:
        assert body.throttle_time == datetime.timedelta(milliseconds=250)
    (_, ok), (_, bad), _ = answers
    if version >= 8:
        expected = [(0, f"{NOT_JSON} in topic partition {TOPIC}-1")]
        assert record_errors(bad) == expected
        assert bad.error_message == kafka_message(expected)
        assert ok.error_message is None and record_errors(ok) == []
    else:
        assert not hasattr(bad, "record_errors") and not hasattr(bad, "error_message")


def test_a_forwarded_partition_the_broker_leaves_out_is_an_unknown_server_error() -> None:
    _, decision = judged(routed(), 9, three_partitions(9))
    _, answer = judged(routed(), 9, [(TOPIC, 0, records(9, GOOD))])  # the broker answers one
    assert answer.forward is not None
    _, answers = in_order(decision, broker_accepts(answer.forward))
    assert [int(p.error_code) for _, p in answers] == [0, INVALID_RECORD, -1]


def test_every_partition_refused_sends_nothing_upstream() -> None:
    _, decision = judged(routed(), 9, [(TOPIC, 0, records(9, BAD)), (OTHER, 0, records(9, BAD))])
    assert decision.forward is None
    _, answers = in_order(decision, None)
    assert [int(p.error_code) for _, p in answers] == [INVALID_RECORD, INVALID_RECORD]


# ---- reject: request ----


@pytest.mark.parametrize(
    ("version", "code"), [(2, CORRUPT_MESSAGE), (3, INVALID_RECORD), (9, INVALID_RECORD)]
)
def test_reject_request_answers_every_partition_locally(version: int, code: int) -> None:
    """test_reject_request_fails_every_partition, on the engine: nothing goes upstream; the
    refused partition has its own errors, every other one "Invalid record in another
    topic-partition" and no record errors."""
    _, decision = judged(routed(reject_request=True), version, three_partitions(version))
    assert decision.forward is None
    assert [(o.topic, o.index) for o in decision.rejected] == [(TOPIC, 1)]
    _, answers = in_order(decision, None)
    assert [key for key, _ in answers] == [(TOPIC, 0), (TOPIC, 1), (OTHER, 0)]
    assert [int(p.error_code) for _, p in answers] == [code] * 3
    assert [int(p.base_offset) for _, p in answers] == [-1] * 3
    if version >= 8:
        (_, first), (_, bad), (_, other) = answers
        assert [index for index, _ in record_errors(bad)] == [0]
        for partition in (first, other):
            assert partition.error_message == ANOTHER_PARTITION
            assert record_errors(partition) == []


# ---- modes ----


def test_warn_mode_forwards_the_request_and_reports_what_it_would_refuse() -> None:
    """test_warn_mode_stores_the_bad_record_and_counts_it: the broker's answer goes back as it
    is, and the decision keeps the verdict (for the log, the metrics and the journal)."""
    chosen = routed(None, [{"match": TOPIC, "mode": "warn", "policies": ["json"]}])
    frame, decision = judged(chosen, 9, [(TOPIC, 0, records(9, BAD)), (TOPIC, 1, records(9, GOOD))])
    assert decision.forward is frame
    assert decision.rejected == () and not decision.needs_merge
    (warned,) = decision.warned
    assert (warned.topic, warned.index, warned.enforced) == (TOPIC, 0, False)
    assert (warned.verdict.code, warned.verdict.policy) == (INVALID_RECORD, "json")
    assert [(e.index, e.message) for e in warned.verdict.record_errors] == [
        (0, f"{NOT_JSON} in topic partition {TOPIC}-0")
    ]
    _, answers = in_order(decision, broker_accepts(frame))
    assert [int(p.error_code) for _, p in answers] == [0, 0]


def test_off_mode_runs_no_policy_and_reports_nothing() -> None:
    chosen = routed(None, [{"match": TOPIC, "mode": "off", "policies": ["json"]}])
    frame, decision = judged(chosen, 9, [(TOPIC, 0, records(9, BAD))])
    assert decision.forward is frame
    assert decision.rejected == () and decision.warned == ()
    (outcome,) = decision.outcomes
    assert outcome.verdict.ok and outcome.enforced


@pytest.mark.parametrize("mode", ["enforce", "warn", "off"])
def test_a_truncated_batch_is_refused_in_every_mode(mode: str) -> None:
    """test_truncated_batch_is_refused_in_every_mode, on the engine."""
    chosen = routed(None, [{"match": TOPIC, "mode": mode}])
    truncated, fine = records(9, b"this batch is cut short")[:-6], records(9, GOOD)
    _, decision = judged(chosen, 9, [(TOPIC, 0, truncated), (TOPIC, 1, fine)])
    assert [(o.topic, o.index, o.enforced) for o in decision.rejected] == [(TOPIC, 0, True)]
    assert forwarded(decision) == [(TOPIC, 1, fine)]
    _, answers = in_order(
        decision, None if decision.forward is None else broker_accepts(decision.forward)
    )
    (_, refused), (_, accepted) = answers
    assert int(refused.error_code) == INVALID_RECORD
    assert refused.error_message == (
        "Produce requests with version 9 must have at least one record batch per partition"
    )
    assert int(accepted.error_code) == 0


# ---- acks ----


@pytest.mark.parametrize("reject_request", [False, True])
def test_acks_0_with_a_refusal_forwards_the_valid_partitions_and_says_close(
    reject_request: bool,
) -> None:
    """test_acks0_mixed_request_writes_the_valid_partition_then_closes, on the engine: a client
    of acks=0 reads no answer, so a decision with acks 0 and a refusal is what makes the server
    close the connection; the valid partitions still go upstream (not under `reject: request`)."""
    chosen = routed(reject_request=reject_request)
    parts = [(TOPIC, 0, records(9, BAD)), (TOPIC, 1, records(9, GOOD))]
    _, decision = judged(chosen, 9, parts, acks=0)
    assert decision.acks == 0
    assert [(o.topic, o.index) for o in decision.rejected] == [(TOPIC, 0)]
    if reject_request:
        assert decision.forward is None
    else:
        assert forwarded(decision) == [(TOPIC, 1, parts[1][2])]
        assert decision.forward is not None
        assert int(decode_request(decision.forward).body.acks) == 0


def test_acks_0_all_accepted_goes_upstream_unchanged() -> None:
    frame, decision = judged(routed(), 9, [(TOPIC, 0, records(9, GOOD))], acks=0)
    assert decision.acks == 0 and decision.rejected == () and decision.forward is frame


@pytest.mark.parametrize("version", [2, 9])
def test_acks_2_is_invalid_required_acks_for_every_partition_on_every_version(
    version: int,
) -> None:
    """test_acks_2_is_invalid_required_acks_for_every_partition; a code v0-v2 clients get too."""
    parts = [(TOPIC, 0, records(version, GOOD)), (TOPIC, 1, records(version, GOOD))]
    _, decision = judged(routed(), version, parts, acks=2)
    assert decision.forward is None
    _, answers = in_order(decision, None)
    assert [int(p.error_code) for _, p in answers] == [error_codes.INVALID_REQUIRED_ACKS] * 2


# ---- the code and its details per Produce version ----


@pytest.mark.parametrize("version", range(13))
def test_the_answer_per_produce_version(version: int) -> None:
    """v0-v2: the legacy code (CORRUPT_MESSAGE, retried by old clients) stands for a record
    rejection; v3+: INVALID_RECORD; v8+ with the record errors and Kafka's message."""
    _, decision = judged(routed(), version, [(TOPIC, 0, records(version, GOOD, BAD))])
    _, [(_, answer)] = in_order(decision, None)
    assert int(answer.error_code) == (CORRUPT_MESSAGE if version < 3 else INVALID_RECORD)
    assert int(answer.base_offset) == -1
    if version >= 8:
        expected = [(1, f"{NOT_JSON} in topic partition {TOPIC}-0")]
        assert record_errors(answer) == expected
        assert answer.error_message == kafka_message(expected)
    else:
        assert not hasattr(answer, "record_errors") and not hasattr(answer, "error_message")


@pytest.mark.parametrize(
    ("settings", "codes"),
    [
        ({"legacy_below": 0}, [INVALID_RECORD] * 4),
        ({"legacy_below": 9}, [CORRUPT_MESSAGE] * 3 + [INVALID_RECORD]),
        ({"legacy_code": error_codes.UNKNOWN_SERVER_ERROR}, [-1, INVALID_RECORD] + [87] * 2),
    ],
)
def test_the_legacy_code_and_the_versions_it_applies_to_are_settings(
    settings: dict[str, Any], codes: list[int]
) -> None:
    got = []
    for version in (2, 3, 8, 9):
        _, decision = judged(routed(**settings), version, [(TOPIC, 0, records(version, BAD))])
        _, [(_, answer)] = in_order(decision, None)
        got.append(int(answer.error_code))
    assert got == codes


# ---- error profiles ----


@pytest.mark.parametrize(
    ("profile", "missing_key", "invalid_record"),
    [(ErrorProfile.KAFKA, INVALID_RECORD, INVALID_RECORD), (ErrorProfile.KIP, 45, 85)],
)
def test_the_error_profile_numbers_record_rejections(
    profile: ErrorProfile, missing_key: int, invalid_record: int
) -> None:
    """test_null_key_on_compacted_topic_kip_profile_answers_45 and
    test_kip_profile_answers_85_for_other_record_rejections, on the engine: the code changes,
    the record errors stay; batch-level refusals and v0-v2 answers are not the profile's."""
    chosen = routed(None, [{"match": OTHER, **JSON_ONLY}], compacted=True, profile=profile)
    parts = [
        (TOPIC, 0, records(9, b"v", key=None)),
        (OTHER, 0, records(9, BAD)),
        (OTHER, 1, b"\x00\x01not a batch"),
    ]
    _, decision = judged(chosen, 9, parts)
    _, answers = in_order(decision, None)
    assert [int(p.error_code) for _, p in answers] == [missing_key, invalid_record, INVALID_RECORD]
    (_, no_key), (_, not_json), _ = answers
    assert record_errors(no_key) == [(0, compacted_message(TOPIC, 0))]
    assert record_errors(not_json) == [(0, f"{NOT_JSON} in topic partition {OTHER}-0")]
    legacy = [(TOPIC, 0, records(2, b"v", key=None)), (OTHER, 0, records(2, BAD))]
    _, decision = judged(chosen, 2, legacy)
    _, answers = in_order(decision, None)
    assert [int(p.error_code) for _, p in answers] == [CORRUPT_MESSAGE] * 2


# ---- limits.max_records_per_request ----


@pytest.mark.parametrize("version", [2, 9])
def test_more_records_than_the_limit_refuse_every_partition_before_any_policy(
    version: int,
) -> None:
    """test_a_request_over_the_record_limit..., on the engine: MESSAGE_TOO_LARGE for every
    partition on every version (not the legacy code: clients do not retry it), the policies
    never run (the records here are not JSON), nothing goes upstream."""
    chosen = routed(max_records_per_request=10)
    values = [BAD] * 11
    parts = [(TOPIC, 0, records(version, *values[:6])), (OTHER, 0, records(version, *values[6:]))]
    _, decision = judged(chosen, version, parts)
    assert decision.forward is None
    message = (
        "The request declares 11 records, more than the proxy accepts in one request "
        "(10, limits.max_records_per_request)"
    )
    assert [(o.verdict.code, o.verdict.policy, o.verdict.message) for o in decision.outcomes] == [
        (MESSAGE_TOO_LARGE, "max_records_per_request", message)
    ] * 2
    _, answers = in_order(decision, None)
    assert [int(p.error_code) for _, p in answers] == [MESSAGE_TOO_LARGE] * 2
    if version >= 8:
        assert [p.error_message for _, p in answers] == [message] * 2
        assert [record_errors(p) for _, p in answers] == [[], []]


@pytest.mark.parametrize("version", [2, 9])
def test_exactly_the_record_limit_goes_upstream(version: int) -> None:
    chosen = routed(max_records_per_request=10)
    parts = [(TOPIC, 0, records(version, *[GOOD] * 4)), (OTHER, 0, records(version, *[GOOD] * 6))]
    frame, decision = judged(chosen, version, parts)
    assert decision.rejected == () and decision.forward is frame


# ---- the producer state learns from the broker's answer ----


@pytest.mark.parametrize(("broker_code", "gap_code"), [(0, 45), (6, 0)])
def test_observe_feeds_the_producer_state_only_what_the_broker_accepted(
    broker_code: int, gap_code: int
) -> None:
    """test_producer_state_sequence_gap_and_epoch_regression, on the engine: once the broker
    accepted sequence 0 of producer 5, sequence 5 is OUT_OF_ORDER_SEQUENCE_NUMBER; a batch the
    broker refused (NOT_LEADER_OR_FOLLOWER) teaches nothing, and the gap is left to the broker."""
    chosen = routed({"policies": ["batch_integrity", "crc", "producer_state"]})

    def idempotent(sequence: int) -> bytes:
        return build_batch(
            [(b"k", b"v", None, None)], producer_id=5, producer_epoch=0, base_sequence=sequence
        )

    frame, first = judged(chosen, 9, [(TOPIC, 0, idempotent(0))])
    assert first.forward is frame
    chosen.answers.observe(first, broker_accepts(frame, code=broker_code))
    _, gap = judged(chosen, 9, [(TOPIC, 0, idempotent(5))])
    assert [o.verdict.code for o in gap.outcomes] == [gap_code]


# ---- each topic's chain and settings, kept between requests ----


def test_a_topics_view_is_kept_while_its_rule_and_the_clusters_settings_are_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Looked up per request, made once: a new answer of the cluster makes a new one, and the
    names kept are bounded (clients choose them)."""
    from kvproxy.policies.api import UNKNOWN_TOPIC_CONFIG, TopicConfig
    from kvproxy.proxy.produce import topic_views

    learned = {TOPIC: TopicConfig(compacted=False)}
    routing = build_routing(None, [{"match": TOPIC, **JSON_ONLY}], Path("."))
    chosen = ProduceEngine(
        routing,
        ProduceSettings(),
        lambda _: None,
        lambda topic: learned.get(topic, UNKNOWN_TOPIC_CONFIG),
    )
    first = chosen.views.view(TOPIC)
    assert first.chain is routing.chain_for(TOPIC) and first.config.compacted is False
    assert chosen.views.view(TOPIC) is first
    learned[TOPIC] = TopicConfig(compacted=True)
    assert chosen.views.view(TOPIC).config.compacted is True
    monkeypatch.setattr(topic_views, "_VIEWS_KEPT", 3)
    made = [chosen.views.view(f"other-{n}") for n in range(10)]
    assert chosen.views.view("other-9") is made[-1]  # the newest names are kept
    assert chosen.views.view("other-0") is not made[0]  # the oldest were let go
