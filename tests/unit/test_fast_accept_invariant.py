"""The compiled fast accept against the Python path: an accept there implies the Python path
accepts every partition and forwards the request unchanged, with the same counts.

Asked of generated requests (hypothesis: versions, topics, partitions, keys, headers, timestamps
near the window's edges, chains and topic settings), of every request of the fuzz corpus and the
golden captures mutated byte by byte and field by field, and of the Kafka test port's requests
(`tests/harness/kafka_parity.produce` asks every one it sends). The accept must also take the
plain requests real clients send, or it accelerates nothing.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.produce.v10.response import NodeEndpoint
from kio.static.primitive import i32

from kvproxy.policies.config import build_routing
from kvproxy.protocol import fast_accept, produce_shape
from kvproxy.protocol.compression import Codec
from kvproxy.protocol.fast_accept import _accept
from kvproxy.protocol.messages import PRODUCE, decode_request, encode_response, make_response
from kvproxy.protocol.produce import partition_answer, produce_answer, produce_response_types
from kvproxy.protocol.records import build_batch
from kvproxy.proxy.produce.decision import ProduceSettings
from kvproxy.proxy.produce.engine import ProduceEngine
from tests.harness import fuzz
from tests.harness.fast_accept import holds_invariant

pytestmark = pytest.mark.compiled

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_700_000_000_000
HOUR = 3_600_000
TOPIC_ID = uuid.UUID("6a1f5d2e-0000-4000-8000-00000000abcd")


def engine(
    policies: list[Any] | None = None,
    *,
    compacted: bool = False,
    settings: ProduceSettings | None = None,
    topics: list[dict[str, Any]] | None = None,
) -> ProduceEngine:
    defaults = None if policies is None else {"policies": policies}
    routing = build_routing(defaults, topics, ROOT)
    return ProduceEngine(
        routing,
        settings or ProduceSettings(),
        lambda _topic: compacted,
        topic_named={TOPIC_ID: "t-id"}.get,
    )


ENGINES: dict[str, Callable[[], ProduceEngine]] = {
    "default": engine,
    "compacted": lambda: engine(compacted=True),
    "narrow_window": lambda: engine(
        ["batch_integrity", "crc", {"timestamps": {"before_max_ms": 1000, "after_max_ms": 500}}]
    ),
    "log_append_time": lambda: engine(["crc", {"timestamps": {"type": "LogAppendTime"}}]),
    "offsets_and_format": lambda: engine(["batch_integrity", "crc", "offsets", "message_format"]),
    "none_compression": lambda: engine(["crc", {"compression": {"allowed": ["none"]}}]),
    "record_limit": lambda: engine(settings=ProduceSettings(max_records_per_request=3)),
    "small_batches": lambda: engine(
        topics=[{"match": "t*", "config": {"max.message.bytes": 200, "segment.bytes": 300}}]
    ),
    "warn": lambda: engine(topics=[{"match": "t*", "mode": "warn"}]),
}


# ---- generated requests ----------------------------------------------------------------------

records_strategy = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=12)),
        st.one_of(st.none(), st.binary(max_size=40)),
        st.lists(
            st.tuples(st.sampled_from(["h", "é", "tenant"]), st.binary(max_size=4)), max_size=2
        ),
        st.sampled_from([NOW, NOW - 999, NOW - 1001, NOW + 499, NOW + 501, NOW - HOUR * 30, -1]),
    ),
    min_size=1,
    max_size=5,
)


def batch_of(records: list[Any], **options: Any) -> bytes:
    return build_batch(
        [(key, value, headers or None, ts) for key, value, headers, ts in records], **options
    )


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    version = draw(st.integers(3, 13))
    topics = draw(st.lists(st.sampled_from(["t1", "t2", "other"]), min_size=1, max_size=3))
    parts = []
    for partition, topic in enumerate(topics):
        batch = batch_of(
            draw(records_strategy),
            codec=draw(st.sampled_from([Codec.NONE, Codec.NONE, Codec.NONE, Codec.GZIP])),
        )
        parts.append((TOPIC_ID if version >= 13 else topic, partition, batch))
    transactional_id = draw(st.sampled_from([None, None, "tx"]))
    return fuzz.produce_request(
        version, 9, parts, acks=draw(st.sampled_from([-1, 1, 0])), transactional_id=transactional_id
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=requests(), chain=st.sampled_from(sorted(ENGINES)))
def test_generated_requests_hold_the_invariant(request: bytes, chain: str) -> None:
    holds_invariant(ENGINES[chain](), request, NOW, named={TOPIC_ID: "t-id"})


# ---- corpus, golden captures, mutations ------------------------------------------------------


def produce_seeds() -> list[bytes]:
    seeds = [*fuzz.golden_requests(), *fuzz.corpus()]
    return [s for s in seeds if len(s) >= 2 and int.from_bytes(s[:2], "big") == PRODUCE]


MUTATORS = (
    fuzz.flip_bits,
    fuzz.set_bytes,
    fuzz.insert_bytes,
    fuzz.delete_bytes,
    fuzz.truncate,
    fuzz.extend,
    fuzz.int32_length,
    fuzz.int16_length,
    fuzz.varint,
    fuzz.batch_field,
    fuzz.api_version,
)


def test_corpus_and_mutations_hold_the_invariant() -> None:
    """Every seed and 6,000 of its mutations (one to three steps), on every chain; some of the
    mutations must still be accepted (a field the checks do not read, a CRC recomputed)."""
    rng = random.Random(40)
    engines = {name: make() for name, make in ENGINES.items()}
    accepted_seeds = accepted_mutants = 0
    seeds = produce_seeds()
    for seed in seeds:
        accepted_seeds += any(
            holds_invariant(e, seed, CORPUS_NOW) is not None for e in engines.values()
        )
    for _ in range(6000):
        mutant = rng.choice(seeds)
        for _step in range(rng.randint(1, 3)):
            mutant = rng.choice(MUTATORS)(rng, mutant)
        for e in engines.values():
            accepted_mutants += holds_invariant(e, mutant, CORPUS_NOW) is not None
    assert accepted_seeds >= 20, (
        accepted_seeds,
        len(seeds),
    )  # most seeds are compressed, legacy, odd
    assert accepted_mutants > 100, accepted_mutants


CORPUS_NOW = 1_795_400_000_000
"""A clock after every record of the corpus (2026-09) and the golden captures (2026-11): within
the default window of them all (the invariant holds at any clock)."""


# ---- what it must accept, and what it must leave to Python ------------------------------------


def plain(version: int = 9, **overrides: Any) -> bytes:
    records = overrides.pop("records", [(b"k", b"v" * 100, None, NOW)])
    return fuzz.produce_request(version, 5, [("t1", 0, batch_of(records, **overrides))])


@pytest.mark.parametrize("version", range(3, 13))
def test_a_plain_request_is_accepted_with_its_counts(version: int) -> None:
    accepted = holds_invariant(engine(), plain(version), NOW)
    assert accepted == (version, 5, -1, (("t1", 1, 1),))


def test_a_v13_request_is_accepted_under_its_topic_name() -> None:
    request = fuzz.produce_request(13, 5, [(TOPIC_ID, 0, batch_of([(b"k", b"v", None, NOW)]))])
    assert holds_invariant(engine(), request, NOW, named={TOPIC_ID: "t-id"}) == (
        13,
        5,
        -1,
        (("t-id", 1, 1),),
    )
    unknown = fuzz.produce_request(13, 5, [(uuid.uuid4(), 0, batch_of([(b"k", b"v", None, NOW)]))])
    assert engine().accept_compiled(unknown, now_ms=NOW) is None


@pytest.mark.parametrize(
    ("case", "make"),
    [
        ("bad crc", lambda: _flip_value(plain())),
        ("null key, compacted", lambda: plain(records=[(None, b"v", None, NOW)])),
        ("too old", lambda: plain(records=[(b"k", b"v", None, NOW - HOUR * 24 * 400)])),
        ("gzip", lambda: plain(codec=Codec.GZIP)),
        (
            "acks 0",
            lambda: fuzz.produce_request(
                9, 5, [("t1", 0, batch_of([(b"k", b"v", None, NOW)]))], acks=0
            ),
        ),
        ("v2", lambda: fuzz.produce_request(2, 5, [("t1", 0, None)])),
        ("no records", lambda: fuzz.produce_request(9, 5, [("t1", 0, None)])),
    ],
)
def test_not_sure_of_what_it_does_not_prove(case: str, make: Callable[[], bytes]) -> None:
    strict = engine(
        ["batch_integrity", "crc", {"timestamps": {"before_max_ms": HOUR}}, "compacted_key"],
        compacted=True,
    )
    assert strict.accept_compiled(make(), now_ms=NOW) is None, case


def _flip_value(request: bytes) -> bytes:
    at = request.index(b"v" * 100)
    return request[:at] + b"w" + request[at + 1 :]


def test_a_chain_with_a_policy_without_a_form_is_left_to_python() -> None:
    assert engine(["crc", "json"]).accept_compiled(plain(), now_ms=NOW) is None
    assert engine(["crc"]).accept_compiled(plain(), now_ms=NOW) is not None


def test_a_topic_whose_settings_are_unknown_is_left_to_python() -> None:
    """The Python path describes such a topic before deciding: the accept never guesses."""
    from kvproxy.policies.api import UNKNOWN_TOPIC_CONFIG

    routing = build_routing(None, None, ROOT)
    unknown = ProduceEngine(
        routing, ProduceSettings(), lambda _t: None, lambda _t: UNKNOWN_TOPIC_CONFIG
    )
    assert unknown.accept_compiled(plain(), now_ms=NOW) is None


def test_the_form_callback_failing_raises_and_holds_nothing() -> None:
    def failing(topic: object) -> None:
        raise RuntimeError("no form")

    with pytest.raises(RuntimeError, match="no form"):
        _accept.accept_produce(plain(), failing, NOW, 100, 10_000, -1)
    with pytest.raises(TypeError):
        _accept.accept_produce(plain(), lambda t: ("t1", (1, 2)), NOW, 100, 10_000, -1)


@given(st.binary(max_size=3000))
@settings(max_examples=300, deadline=None)
def test_its_crc32c_is_crc32c(data: bytes) -> None:
    assert _accept.crc32c(data) == crc32c.crc32c(data)


# ---- the switch ---------------------------------------------------------------------------------


def test_no_extensions_forces_both_pure_python_twins() -> None:
    script = (
        "from kvproxy.protocol import fast_accept\n"
        "from kvproxy.protocol.records import skim\n"
        "print(fast_accept.COMPILED, skim.COMPILED,"
        " fast_accept.accept_produce is fast_accept.python_accept_produce)\n"
    )
    env = {**os.environ, "KVPROXY_NO_EXTENSIONS": "1", "PYTHONPATH": str(ROOT)}
    forced = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
    )
    assert forced.stdout.split() == ["False", "False", "True"]
    env["KVPROXY_NO_EXTENSIONS"] = "0"
    allowed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
    )
    assert allowed.stdout.split() == ["True", "True", "False"]
    assert fast_accept.COMPILED or os.environ.get("KVPROXY_NO_EXTENSIONS") == "1"


def test_every_seed_decodes() -> None:
    """The seeds are Produce requests Python reads: a mutant differs by its mutation alone."""
    for seed in produce_seeds():
        assert decode_request(seed).header.api_key == PRODUCE


# ---- the broker's answer: plainly naming no broker ----------------------------------------------


def _python_names_nodes(frame: bytes, version: int, monkeypatch: pytest.MonkeyPatch) -> bool:
    with monkeypatch.context() as patched:
        patched.setattr(produce_shape, "answer_plain", fast_accept.python_answer_plain)
        return produce_shape.answer_names_nodes(frame, version)


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, int]:
    version = draw(st.integers(9, 13))
    types = produce_response_types(version)
    partitions = [
        partition_answer(
            types,
            index,
            draw(st.sampled_from([0, 0, 87, 6])),
            message=draw(st.sampled_from([None, "bad", "é"])) if version >= 8 else None,
            record_errors=tuple(
                draw(st.lists(st.tuples(st.integers(0, 9), st.none()), max_size=2))
            ),
        )
        for index in range(draw(st.integers(0, 3)))
    ]
    topic: Any = TOPIC_ID if version >= 13 else "t1"
    body = produce_answer(types, [(topic, partitions)])
    if version >= 10 and draw(st.booleans()):
        node = NodeEndpoint(node_id=i32(4), host="kafka-4", port=i32(9095), rack=None)
        body = dataclasses.replace(body, node_endpoints=(node,))
    frame = encode_response(PRODUCE, version, make_response(PRODUCE, version, 8, body))
    cut = draw(st.sampled_from([None, None, None, 1, 3, 9]))
    if cut is not None:
        frame = frame[:-cut] if draw(st.booleans()) else frame + b"\x00" * cut
    if draw(st.booleans()):
        at = draw(st.integers(0, len(frame) - 1))
        frame = frame[:at] + bytes([frame[at] ^ draw(st.integers(1, 255))]) + frame[at + 1 :]
    return frame, version


@settings(
    max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(answer=answers())
def test_an_answer_the_compiled_scan_calls_plain_names_no_broker(
    answer: tuple[bytes, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    frame, version = answer
    if _accept.answer_plain(frame, version):
        assert not _python_names_nodes(frame, version, monkeypatch)


def test_the_compiled_scan_is_sure_of_the_common_answer() -> None:
    for version in range(9, 14):
        types = produce_response_types(version)
        topic: Any = TOPIC_ID if version >= 13 else "t1"
        body = produce_answer(types, [(topic, [partition_answer(types, 0, 0)])])
        frame = encode_response(PRODUCE, version, make_response(PRODUCE, version, 8, body))
        assert _accept.answer_plain(frame, version), version
        assert not _accept.answer_plain(frame + b"\x00", version)


def test_the_topic_ids_it_keeps_are_bounded() -> None:
    """A client naming ever new v13 topic ids grows no cache past its bound."""
    from kvproxy.proxy.produce.compiled_accept import IDS_KEPT

    made = engine()
    batch = batch_of([(b"k", b"v", None, NOW)])
    for index in range(IDS_KEPT + 50):
        request = fuzz.produce_request(13, 5, [(uuid.UUID(int=index + 1), 0, batch)])
        assert made.accept_compiled(request, now_ms=NOW) is None  # unknown ids: not sure
    assert 0 < len(made.compiled._ids) <= IDS_KEPT


def test_a_failing_form_lookup_is_logged_and_left_to_python(
    caplog: pytest.LogCaptureFixture,
) -> None:
    made = engine()

    def broken(topic: str) -> object:
        raise RuntimeError("no view")

    made.compiled._view_now = broken  # type: ignore[assignment]
    with caplog.at_level("ERROR", logger="kvproxy"):
        assert made.accept_compiled(plain(), now_ms=NOW) is None
    assert any("the fast accept failed" in r.getMessage() for r in caplog.records)
