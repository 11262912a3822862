"""The Produce request scan and whole-request refusal answer (`kvproxy.protocol.produce_shape`):
what it
reads and writes must be what the codec reads and writes, on every Produce version."""

from __future__ import annotations

import uuid

import pytest

from kvproxy.protocol import error_codes
from kvproxy.protocol.messages import PRODUCE, decode_response, encode_response, make_response
from kvproxy.protocol.produce import partition_answer, produce_answer, produce_response_types
from kvproxy.protocol.produce_shape import answer_names_nodes, refusal_answer, scan_produce
from tests.harness.partitions import many_partitions_request

VERSIONS = range(14)
ALPHA, BETA = str(uuid.UUID(int=0xA1)), str(uuid.UUID(int=0xB2))
"""v13 names topics by id: the scan gives an id as its text."""


def _names(version: int) -> tuple[str, str]:
    return (ALPHA, BETA) if version >= 13 else ("alpha", "beta")


@pytest.mark.parametrize("version", VERSIONS)
def test_scan_reads_every_topic_and_partition(version: int) -> None:
    alpha, beta = _names(version)
    payload = many_partitions_request(
        version, {alpha: 3, beta: 2}, correlation_id=77, records=b"\x01\x02\x03"
    )
    shape = scan_produce(payload, 100, indexes=True)
    assert shape.complete
    assert (shape.api_version, shape.correlation_id, shape.acks) == (version, 77, 1)
    assert shape.partitions == 5
    assert [(name, list(indexes)) for name, indexes in shape.topics] == [
        (alpha, [0, 1, 2]),
        (beta, [0, 1]),
    ]


@pytest.mark.parametrize("version", [2, 8, 9])
def test_scan_stops_once_past_the_limit(version: int) -> None:
    payload = many_partitions_request(version, {"a": 4, "b": 1_000_000 // 8})
    shape = scan_produce(payload, 10)
    assert not shape.complete
    assert shape.partitions == 4 + 1_000_000 // 8  # the declared count, not read
    assert shape.first_topic == "a"
    assert shape.topics == ()


@pytest.mark.parametrize("version", VERSIONS)
def test_refusal_answer_is_what_the_codec_writes(version: int) -> None:
    """Byte for byte the codec's answer (message on the first partition only), so every client
    parses it as it parses a broker's."""
    alpha, beta = _names(version)
    payload = many_partitions_request(version, {alpha: 3, beta: 2}, correlation_id=5)
    shape = scan_produce(payload, 100, indexes=True)
    message = "too many partitions"
    written = refusal_answer(shape, error_codes.MESSAGE_TOO_LARGE, message)
    types = produce_response_types(version)
    first = True
    topics = []
    for name, indexes in shape.topics:
        answers = []
        for index in indexes:
            answers.append(
                partition_answer(
                    types, index, error_codes.MESSAGE_TOO_LARGE, message=message if first else None
                )
            )
            first = False
        topics.append((uuid.UUID(name) if version >= 13 else name, answers))
    response = make_response(PRODUCE, version, 5, produce_answer(types, topics))
    assert written == encode_response(PRODUCE, version, response)
    body = decode_response(written, PRODUCE, version).body
    codes = [int(p.error_code) for t in body.responses for p in t.partition_responses]
    assert codes == [error_codes.MESSAGE_TOO_LARGE] * 5


@pytest.mark.parametrize("version", VERSIONS)
def test_the_harness_request_is_what_the_codec_reads(version: int) -> None:
    from kvproxy.protocol.messages import decode_request

    alpha, beta = _names(version)
    payload = many_partitions_request(version, {alpha: 2, beta: 1}, records=None)
    body = decode_request(payload).body
    named = [
        (str(t.topic_id if version >= 13 else t.name), [int(p.index) for p in t.partition_data])
        for t in body.topic_data
    ]
    assert named == [(alpha, [0, 1]), (beta, [0])]


def _answer(version: int, *, endpoints: bool = False) -> bytes:
    """A broker's flexible Produce answer: two topics, record errors and messages, a partition
    naming its new leader (`current_leader`, a per-partition tagged field); `node_endpoints`
    (the top-level tagged field) only when asked."""
    import dataclasses

    from kio.static.primitive import i32

    types = produce_response_types(version)
    first = partition_answer(
        types, 0, error_codes.INVALID_RECORD, message="bad", record_errors=((1, "x"), (2, None))
    )
    if version >= 10:
        leader = type(first.current_leader)(leader_id=i32(3), leader_epoch=i32(7))
        first = dataclasses.replace(first, current_leader=leader)
    topics = [("alpha", [first, partition_answer(types, 1, 0)]), ("beta", [])]
    body = produce_answer(types, topics)
    if endpoints:
        from kio.schema.produce.v10.response import NodeEndpoint

        node = NodeEndpoint(node_id=i32(4), host="kafka-4", port=i32(9095), rack=None)
        body = dataclasses.replace(body, node_endpoints=(node,))
    return encode_response(PRODUCE, version, make_response(PRODUCE, version, 8, body))


@pytest.mark.parametrize("version", [9, 10, 11, 12])
def test_an_answer_naming_no_broker_is_read_as_such(version: int) -> None:
    assert not answer_names_nodes(_answer(version))


@pytest.mark.parametrize("version", [10, 11, 12])
def test_an_answer_with_node_endpoints_names_brokers(version: int) -> None:
    assert answer_names_nodes(_answer(version, endpoints=True))


@pytest.mark.parametrize("version", [9, 12])
def test_bytes_that_are_not_an_answer_are_left_to_the_codec(version: int) -> None:
    """Cut short, or with bytes after its end: not passed on unread (the codec refuses them)."""
    answer = _answer(version)
    for cut in range(len(answer)):
        assert answer_names_nodes(answer[:cut])
    assert answer_names_nodes(answer + b"\x00")
