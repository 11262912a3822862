"""The fuzzer's inputs (tests/harness/fuzz.py): reproducible, varied, and right about the proxy.

The integration test that sends them (tests/integration/test_fuzz_proxy.py) relies on three
things proven here: an input depends only on (seed, index); every mutator runs on every seed
request without raising; `expected_answers` splits a wire the way the proxy's frame decoder does.
"""

from __future__ import annotations

import random
import struct
from collections import Counter

import pytest

from kvproxy.protocol.compression import Codec
from kvproxy.protocol.messages import PRODUCE, decode_request
from kvproxy.protocol.records import read_batches
from tests.harness import fuzz

MAX_FRAME = 100 * 1024 * 1024


def test_an_input_depends_only_on_seed_and_index() -> None:
    first = [fuzz.make_input(7, i) for i in range(200)]
    again = [fuzz.make_input(7, i) for i in reversed(range(200))][::-1]
    assert first == again
    assert fuzz.make_input(8, 0) != fuzz.make_input(7, 0)


def test_the_corpus_holds_golden_and_generated_requests_that_decode() -> None:
    corpus = fuzz.corpus()
    assert len(fuzz.golden_requests()) >= 20
    versions: Counter[tuple[int, int]] = Counter()
    for payload in corpus:
        request = decode_request(payload)
        versions[(request.header.api_key, request.header.api_version)] += 1
    assert {v for k, v in versions if k == PRODUCE} == set(range(12))
    assert {k for k, _ in versions} == {0, 3, 18}


@pytest.mark.parametrize("name", sorted(fuzz.PAYLOAD_MUTATORS))
def test_every_mutator_runs_on_every_seed_request(name: str) -> None:
    mutator = fuzz.PAYLOAD_MUTATORS[name][0]
    rng = random.Random(name)
    changed = 0
    for payload in fuzz.corpus():
        for _ in range(3):
            out = mutator(rng, payload)
            assert isinstance(out, bytes)
            changed += out != payload
    assert changed > len(fuzz.corpus())  # most applications change something


def test_stacked_mutations_never_raise() -> None:
    steps: Counter[str] = Counter()
    for index in range(3000):
        item = fuzz.make_input(11, index)
        steps.update(s.split("=")[0].split("[")[0] for s in item.steps)
        fuzz.expected_answers(item.wire, MAX_FRAME)
    assert set(fuzz.PAYLOAD_MUTATORS) <= set(steps)
    assert {"pipeline", "size_prefix", "wire_truncated"} <= set(steps)


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD])
def test_a_bomb_is_small_valid_and_expands(codec: Codec) -> None:
    bomb = fuzz.bomb_batch(codec, 4 * 1024 * 1024)
    assert len(bomb) < 1024 * 1024
    (batch,) = read_batches(bomb)
    assert batch.crc_valid()
    (record,) = list(batch.records())
    assert record.value == bytes(4 * 1024 * 1024)


def test_expected_answers_follow_the_frame_decoder() -> None:
    api_versions = fuzz.api_versions_request(3, 1)
    acks0 = fuzz.produce_request(9, 2, [(fuzz.TOPIC, 0, None)], acks=0)
    produce = fuzz.produce_request(9, 3, [(fuzz.TOPIC, 0, None)])
    wire = b"".join(fuzz.frame_of(p) for p in (api_versions, acks0, produce))
    expected = fuzz.expected_answers(wire, MAX_FRAME)
    assert expected.answers == ((18, 3, 1), (0, 9, 3))
    assert expected.ends_cleanly
    # a partial frame: answers for what is whole, and the connection is not clean
    assert not fuzz.expected_answers(wire + b"\x00\x00", MAX_FRAME).ends_cleanly
    # an undecodable Produce request ends the stream: nothing after it is answered
    broken = fuzz.frame_of(produce[:-3]) + fuzz.frame_of(api_versions)
    assert fuzz.expected_answers(broken, MAX_FRAME).answers == ()
    # a size prefix above the maximum ends it too
    too_big = struct.pack(">i", MAX_FRAME + 1) + b"x"
    assert not fuzz.expected_answers(fuzz.frame_of(api_versions) + too_big, MAX_FRAME).ends_cleanly
