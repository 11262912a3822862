"""Produce v13 (topics by id, KIP-516) without sockets: the request read once as the codec reads
it, its topics named from the ids the proxy learned, the name's policies run, what goes upstream
named by id again, the answer merged by id, and an id nobody knows answered UNKNOWN_TOPIC_ID as
Kafka answers it."""

from __future__ import annotations

import uuid
from pathlib import Path

from kvproxy.policies.config import build_routing
from kvproxy.protocol import error_codes
from kvproxy.protocol.messages import PRODUCE, decode_request, decode_response
from kvproxy.protocol.produce_request import read_produce
from kvproxy.protocol.produce_shape import answer_names_nodes, refusal_answer, scan_produce
from kvproxy.protocol.produce_topics import name_topics, topic_ids_of, unnamed_ids
from kvproxy.proxy.produce.decision import ProduceSettings
from kvproxy.proxy.produce.engine import ProduceEngine
from tests.harness.engine import answer_of, batch, judged_by
from tests.harness.fuzz import produce_request
from tests.harness.produce import JSON_ONLY

ORDERS = uuid.UUID("6f1c2d3e-4a5b-4c6d-8e7f-901234567890")
LOGS = uuid.UUID("0a0b0c0d-0e0f-4011-8213-141516171819")
NOBODY = uuid.UUID("ffffffff-0000-4000-8000-000000000001")
NAMES = {ORDERS: "orders", LOGS: "logs"}


def _engine() -> ProduceEngine:
    routing = build_routing(None, [{"match": "orders", **JSON_ONLY}], Path("."))
    return ProduceEngine(routing, ProduceSettings(), lambda _: False)


def _request(parts: list[tuple[uuid.UUID, int, bytes]]) -> bytes:
    return produce_request(13, 21, parts)


def _v13_answer(partitions: list[tuple[uuid.UUID, int]]) -> bytes:
    """A broker's v13 answer: success for each (topic id, partition) forwarded."""
    from kvproxy.protocol.messages import encode_response, make_response
    from kvproxy.protocol.produce import partition_answer, produce_answer, produce_response_types

    types = produce_response_types(13)
    topics: dict[uuid.UUID, list[object]] = {}
    for topic_id, index in partitions:
        topics.setdefault(topic_id, []).append(partition_answer(types, index, 0))
    body = produce_answer(types, list(topics.items()))
    return encode_response(PRODUCE, 13, make_response(PRODUCE, 13, 21, body))


def test_a_v13_request_is_read_once_as_the_codec_reads_it() -> None:
    frame = _request([(ORDERS, 0, batch(b"{}")), (LOGS, 1, batch(b"x"))])
    assert read_produce(frame, 100) == decode_request(frame)
    assert topic_ids_of(decode_request(frame)) == [ORDERS, LOGS]


def test_the_scan_counts_v13_partitions_and_its_refusal_names_topics_by_id() -> None:
    frame = _request([(ORDERS, 0, batch(b"{}")), (ORDERS, 1, batch(b"{}")), (LOGS, 2, b"")])
    shape = scan_produce(frame, 100, indexes=True)
    assert shape.complete and shape.partitions == 3
    assert [(t, list(i)) for t, i in shape.topics] == [(str(ORDERS), [0, 1]), (str(LOGS), [2])]
    body = decode_response(refusal_answer(shape, 10, "too many"), PRODUCE, 13).body
    assert [
        (t.topic_id, [int(p.index) for p in t.partition_responses]) for t in body.responses
    ] == [
        (ORDERS, [0, 1]),
        (LOGS, [2]),
    ]
    assert {int(p.error_code) for t in body.responses for p in t.partition_responses} == {10}


def test_a_v13_answer_naming_no_broker_is_known_as_such() -> None:
    assert not answer_names_nodes(_v13_answer([(ORDERS, 0), (LOGS, 3)]), 13)
    # read as v12 (a name where the id is), the same bytes do not parse: decoded to be sure
    assert answer_names_nodes(_v13_answer([(ORDERS, 0)]), 12)


def test_the_names_policies_run_and_the_refused_partition_stays_out() -> None:
    frame = _request([(ORDERS, 0, batch(b'{"ok": 1}')), (ORDERS, 1, batch(b"not json"))])
    request = name_topics(decode_request(frame), NAMES.get)
    assert unnamed_ids(request) == []
    engine = _engine()
    decision = judged_by(engine.decide(frame, request), engine)
    assert [(o.topic, o.index, o.verdict.ok) for o in decision.outcomes] == [
        ("orders", 0, True),
        ("orders", 1, False),
    ]
    assert decision.topic_ids == (ORDERS,)
    assert decision.forward is not None
    forwarded = decode_request(decision.forward)
    assert forwarded.header.api_version == 13
    assert [
        (t.topic_id, [int(p.index) for p in t.partition_data]) for t in forwarded.body.topic_data
    ] == [(ORDERS, [0])]
    answer = decode_response(answer_of(decision, _v13_answer([(ORDERS, 0)])), PRODUCE, 13).body
    (topic,) = answer.responses
    assert topic.topic_id == ORDERS
    codes = {int(p.index): int(p.error_code) for p in topic.partition_responses}
    assert codes == {0: 0, 1: error_codes.INVALID_RECORD}


def test_an_all_valid_v13_request_goes_upstream_as_its_own_bytes() -> None:
    frame = _request([(ORDERS, 0, batch(b"{}")), (LOGS, 0, batch(b"plain text"))])
    engine = _engine()
    decision = judged_by(
        engine.decide(frame, name_topics(decode_request(frame), NAMES.get)), engine
    )
    assert decision.forward is frame
    assert not decision.rejected


def test_an_id_the_cluster_does_not_know_is_answered_unknown_topic_id() -> None:
    frame = _request([(NOBODY, 0, batch(b"{}")), (ORDERS, 2, batch(b"{}"))])
    request = name_topics(decode_request(frame), NAMES.get)
    assert unnamed_ids(request) == [NOBODY]
    engine = _engine()
    decision = judged_by(engine.decide(frame, request), engine)
    unknown = next(o for o in decision.outcomes if o.index == 0)
    assert unknown.verdict.code == error_codes.UNKNOWN_TOPIC_ID
    assert unknown.topic == f"<unknown topic id {NOBODY}>"
    assert decision.forward is not None  # the known topic's partition still goes
    forwarded = decode_request(decision.forward)
    assert [t.topic_id for t in forwarded.body.topic_data] == [ORDERS]
    answer = decode_response(answer_of(decision, _v13_answer([(ORDERS, 2)])), PRODUCE, 13).body
    by_id = {t.topic_id: t.partition_responses for t in answer.responses}
    (refused,) = by_id[NOBODY]
    # as Kafka answers it: the code, no message, no offsets
    assert (int(refused.error_code), refused.error_message, int(refused.base_offset)) == (
        error_codes.UNKNOWN_TOPIC_ID,
        None,
        -1,
    )
    assert [int(p.error_code) for p in by_id[ORDERS]] == [0]


def test_an_id_learned_later_names_the_topic_when_asked_again() -> None:
    frame = _request([(NOBODY, 0, batch(b"{}"))])
    first = name_topics(decode_request(frame), NAMES.get)
    assert unnamed_ids(first) == [NOBODY]
    again = name_topics(first, {**NAMES, NOBODY: "late"}.get)
    assert unnamed_ids(again) == []
    assert again.body.topic_data[0].name == "late"
