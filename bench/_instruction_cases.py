"""The cases of the instruction-count check (`bench/instructions.py`): fixed inputs and the calls
the proxy makes for them, each a step that callgrind counts in a loop.

The inputs are built in the process, deterministically: keyed records of exactly 1 KiB (10-byte
key, 1014-byte JSON value from a seeded generator), every timestamp and the decision's clock
fixed at 2026-01-01T00:00:00Z.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench._engine_calls import DEFAULT_POLICIES, make_engine, produce_frame
from kvproxy.protocol.budget import Allowance, MemoryBudget
from kvproxy.protocol.framing import size_prefix
from kvproxy.protocol.messages import (
    PRODUCE,
    decode_request,
    encode_response,
    make_response,
)
from kvproxy.protocol.produce import partition_answer, produce_answer, produce_response_types
from kvproxy.protocol.records import build_batch
from kvproxy.protocol.request_view import RequestView
from kvproxy.proxy.produce.decider import INLINE_DECODE_BYTES
from kvproxy.proxy.produce.engine import ProduceEngine
from kvproxy.proxy.produce.exchange import ProduceExchange
from kvproxy.proxy.produce.many_partitions import read_unless_many

__all__ = ["CASES", "NOW_MS", "WARM_UP", "Case"]

NOW_MS = 1_767_225_600_000
"""2026-01-01T00:00:00Z: every record's timestamp and the clock `decide` judges them by."""
TOPIC = "bench-instructions"
RECORD_BYTES = 1024
KEY_BYTES = 10
LARGE_RECORDS = 1024
"""1024 records of 1 KiB: one batch of about 1 MiB."""
WORDS = ("click", "view", "order", "cart", "pay", "refund", "login", "search", "share", "like")
JSON_POLICIES: tuple[str, ...] = (*DEFAULT_POLICIES, "json")


# ---- inputs --------------------------------------------------------------------------------


def json_value(rng: random.Random, index: int) -> bytes:
    """A JSON object of exactly RECORD_BYTES - KEY_BYTES bytes."""
    document = {
        "id": index,
        "event": rng.choice(WORDS),
        "user": f"user-{rng.randrange(100_000):05d}",
        "amount": rng.randrange(1_000_000) / 100,
        "tags": [rng.choice(WORDS) for _ in range(8)],
        "note": "",
    }
    size = RECORD_BYTES - KEY_BYTES
    bare = json.dumps(document, separators=(",", ":"))
    document["note"] = " ".join(rng.choice(WORDS) for _ in range(size // 4))[: size - len(bare)]
    value = json.dumps(document, separators=(",", ":")).encode()
    assert len(value) == size, len(value)
    return value


def make_batch(count: int, seed: int = 30) -> bytes:
    """One uncompressed magic-2 batch of `count` keyed 1 KiB records stamped NOW_MS."""
    rng = random.Random(seed)
    records = [(b"key-%06d" % i, json_value(rng, i), None, NOW_MS) for i in range(count)]
    return build_batch(records)


def produce_request(partitions: Sequence[bytes]) -> bytes:
    """A Produce v9 request (acks=all) with partition i of TOPIC carrying `partitions[i]`."""
    return produce_frame(
        *partitions, topic=TOPIC, correlation_id=7, client_id="kvproxy-instructions"
    )


def broker_answer(partitions: Sequence[int]) -> bytes:
    """The broker's Produce v9 answer, no error, for the given partitions of TOPIC."""
    types = produce_response_types(9)
    body = produce_answer(types, [(TOPIC, [partition_answer(types, i, 0) for i in partitions])])
    return encode_response(PRODUCE, 9, make_response(PRODUCE, 9, 7, body))


# ---- the measured work ---------------------------------------------------------------------


def produce_step(engine: ProduceEngine, frame: bytes, upstream: bytes) -> Callable[[], bytes]:
    """One Produce request as the proxy handles it on the event loop (`ProduceExchange.start`):
    read, decided with an inline allowance, and its broker answer passed through
    `ProduceExchange.merged`."""
    budget = MemoryBudget(64 * 1024 * 1024)
    bound = engine.settings.inline_max_partitions

    def step() -> bytes:
        request = read_unless_many(RequestView(frame), bound)
        assert request is not None  # one partition: read on the loop
        allowance = Allowance(INLINE_DECODE_BYTES, budget, inline=True)
        try:
            decision = engine.decide(frame, request, now_ms=NOW_MS, allowance=allowance)
        finally:
            allowance.release()
        exchange = ProduceExchange(engine)
        exchange.decision = decision
        return exchange.merged(upstream)

    answer = step()
    if answer is not upstream:  # every partition accepted: forwarded and answered as they are
        raise AssertionError("the case's request was not accepted whole")
    return step


def merge_step() -> Callable[[], bytes]:
    """The answer to a request of two one-record partitions, the second refused (bad CRC): the
    broker's answer for the first merged with the proxy's error for the second."""
    good = make_batch(1)
    bad = bytearray(make_batch(1, seed=31))
    bad[-1] ^= 0xFF  # the last value byte: the CRC no longer matches
    frame = produce_request([good, bytes(bad)])
    engine = make_engine(DEFAULT_POLICIES)
    decision = engine.decide(frame, decode_request(frame), now_ms=NOW_MS)
    if [o.index for o in decision.rejected] != [1] or decision.forward is None:
        raise AssertionError(f"the merge case was not decided as one refusal: {decision}")
    exchange = ProduceExchange(engine)
    exchange.decision = decision
    upstream = broker_answer([0])

    def step() -> bytes:
        return exchange.merged(upstream)

    if step() is upstream:
        raise AssertionError("the merge case's answer was not merged")
    return step


def accept_step() -> Callable[[], object]:
    """The compiled fast accept of a one-record request (`ProduceEngine.accept_compiled`), its
    topic's form looked up as on the event loop."""
    engine = make_engine(DEFAULT_POLICIES)
    frame = produce_request([make_batch(1)])

    def step() -> object:
        return engine.accept_compiled(frame, now_ms=NOW_MS)

    if step() is None:
        raise AssertionError("the compiled fast accept did not accept the case's request")
    return step


def relay_step(*, compiled: bool) -> Callable[[], Callable[[], object]]:
    """A one-record Produce request and its broker answer through a client connection and its
    upstream side on in-memory transports (tests/harness/connection_pair.py): every Python call
    the relay makes for it, the compiled fast accept's path or (`compiled` False) the Python
    path's."""

    def build() -> Callable[[], object]:
        from tests.harness import connection_pair  # noqa: PLC0415

        pair = _KEPT.enter_context(connection_pair.connection_pair())
        if not compiled:  # this engine's fast accept is never sure (one small call more)
            engine = pair.server.connection_state.decisions.engine
            engine.accept_compiled = lambda _frame, now_ms=None: None  # type: ignore[method-assign]
        payload = connection_pair.produce_request(12, 5)
        answered = connection_pair.produce_answer_ok(12, 5)
        request, answer = size_prefix(payload) + payload, size_prefix(answered) + answered
        client, upstream = pair.client, pair.upstream

        def feed(side: Any, data: bytes) -> None:
            buffer = side.get_buffer(len(data))
            buffer[: len(data)] = data
            side.buffer_updated(len(data))

        def step() -> object:
            feed(client, request)
            feed(upstream, answer)
            written = bytes(pair.to_client.written)
            pair.to_client.written.clear()
            pair.to_broker.written.clear()
            return written

        if step() != answer:
            raise AssertionError("the relay case's answer is not the broker's")
        return step

    return build


_KEPT = contextlib.ExitStack()
"""The relay cases' proxies, kept open while the cases run."""


@dataclass(frozen=True)
class Case:
    description: str
    iterations: int
    """Loop length under callgrind: the count is per iteration, enough to dwarf the loop."""
    build: Callable[[], Callable[[], object]]


def _request_case(records: int, policies: Sequence[str]) -> Callable[[], Callable[[], object]]:
    def build() -> Callable[[], object]:
        frame = produce_request([make_batch(records)])
        return produce_step(make_engine(policies), frame, broker_answer([0]))

    return build


CASES: dict[str, Case] = {
    "produce_1mib_default": Case(
        "Produce v9, one partition, one uncompressed v2 batch of 1024 records of 1 KiB (about "
        "1 MiB), default checks (batch_integrity, crc, timestamps, compacted_key; topic not "
        "compacted): read_unless_many, decide, merged",
        4,
        _request_case(LARGE_RECORDS, DEFAULT_POLICIES),
    ),
    "produce_1mib_json": Case(
        "the same request with the default checks and json (every value parsed)",
        4,
        _request_case(LARGE_RECORDS, JSON_POLICIES),
    ),
    "produce_small": Case(
        "Produce v9, one partition, one batch of one 1 KiB record, default checks: "
        "read_unless_many, decide, merged",
        200,
        _request_case(1, DEFAULT_POLICIES),
    ),
    "accept_small": Case(
        "ProduceEngine.accept_compiled (the compiled fast accept) of the produce_small request",
        400,
        accept_step,
    ),
    "relay_small": Case(
        "a Produce v12 request of one 100-byte record and its broker answer through a client "
        "connection and its upstream side (in-memory transports), accepted by the compiled "
        "fast accept",
        200,
        relay_step(compiled=True),
    ),
    "relay_small_python": Case(
        "the same through the Python path (the fast accept's twin: never sure)",
        200,
        relay_step(compiled=False),
    ),
    "merge_small": Case(
        "ProduceExchange.merged for a request of two one-record partitions, the second refused "
        "(bad CRC): the broker's answer for the first merged with the refusal",
        200,
        merge_step,
    ),
}
WARM_UP = 20
"""Runs of each case before counting: CPython 3.11 specialises a function's bytecode after a few
calls, and the first calls fill caches (routing, chains)."""
