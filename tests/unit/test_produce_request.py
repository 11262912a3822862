"""`kvproxy.protocol.produce_request.read_produce`: a Produce request read once, its partitions
counted on the way; what it gives is what the codec gives, or nothing (the codec's then)."""

from __future__ import annotations

import random

import pytest

from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.messages import decode_request
from kvproxy.protocol.produce_request import read_produce
from kvproxy.protocol.records import build_batch
from tests.harness.fuzz import PAYLOAD_MUTATORS, corpus, produce_request
from tests.harness.partitions import many_partitions_request

VERSIONS = range(3, 13)


def _batch(value: bytes) -> bytes:
    return build_batch([(b"k", value, None, None)])


@pytest.mark.parametrize("version", VERSIONS)
def test_a_request_reads_as_the_codec_decodes_it(version: int) -> None:
    parts = [("alpha", 0, _batch(b"a")), ("alpha", 2, None), ("beta", 1, _batch(b"b" * 300))]
    for transactional_id in (None, "tx-1"):
        payload = produce_request(version, 7, parts, acks=1, transactional_id=transactional_id)
        read = read_produce(payload, 100)
        assert read is not None
        assert read == decode_request(payload)
        records = read.body.topic_data[0].partition_data[0].records
        assert isinstance(records, memoryview) and records.readonly  # a view, as the codec's


@pytest.mark.parametrize("version", [3, 8, 9, 12])
def test_a_request_naming_more_partitions_than_the_bound_is_not_read(version: int) -> None:
    payload = many_partitions_request(version, {"a": 4, "b": 1_000_000 // 8})
    assert read_produce(payload, 10) is None
    assert read_produce(many_partitions_request(version, {"a": 6, "b": 5}), 10) is None
    assert read_produce(many_partitions_request(version, {"a": 5, "b": 5}), 10) is not None


def test_what_the_reader_does_not_take_is_left_to_the_codec() -> None:
    """Legacy versions, another API, bytes after the request: None, not a guess."""
    legacy = produce_request(2, 7, [("alpha", 0, _batch(b"a"))])
    assert read_produce(legacy, 100) is None
    current = produce_request(9, 7, [("alpha", 0, _batch(b"a"))])
    assert read_produce(current + b"\x00", 100) is None
    assert read_produce(b"\x00\x03" + current[2:], 100) is None  # a Metadata api key


def test_mutated_requests_read_as_the_codec_decodes_them_or_not_at_all() -> None:
    """Never a request the codec would refuse or decode otherwise."""
    rng = random.Random(30)
    names = list(PAYLOAD_MUTATORS)
    pool = corpus()
    read_some = 0
    for _ in range(3000):
        payload = rng.choice(pool)
        for name in rng.choices(names, k=rng.choice((1, 2))):
            payload = PAYLOAD_MUTATORS[name][0](rng, payload)
        read = read_produce(payload, 1000)
        if read is None:
            continue
        read_some += 1
        try:
            decoded = decode_request(payload)
        except ProtocolError as exc:
            pytest.fail(f"read a request the codec refuses ({exc}): {payload.hex()}")
        assert read == decoded, payload.hex()
    assert read_some > 100
