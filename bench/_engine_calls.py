"""The calls the engine benchmark (bench/engine.py) times, kept together (the fast path behind them
is being reworked): chains and the engine built the way `kvproxy serve` builds them, one
partition's check, one Produce request's decision; and the work around them as callables (the
decode alone, the CRC alone, the record parsers, decompression)."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from typing import Any

import crc32c
from aiokafka.record.default_records import DefaultRecordBatch
from kio.schema.produce.v9 import request as produce_v9
from kio.schema.types import TopicName
from kio.static.primitive import Records, i16, i32, i32Timedelta

from bench._results import ROOT
from kvproxy.policies.api import ProducedRecords, Verdict, parse_records
from kvproxy.policies.chain import PolicyChain
from kvproxy.policies.config import build_routing
from kvproxy.policies.plugins import default_policies
from kvproxy.protocol.compression import Codec, decompress
from kvproxy.protocol.messages import PRODUCE, decode_request, encode_request, make_request
from kvproxy.protocol.records.layout import V2_HEADER_SIZE
from kvproxy.proxy.produce.decision import ProduceDecision, ProduceSettings
from kvproxy.proxy.produce.engine import ProduceEngine

DEFAULT_POLICIES = default_policies()

TOPIC = "bench-engine"

BATCH_LEVEL_POLICIES: tuple[str, ...] = ("batch_integrity", "crc")


def make_chain(policies: Sequence[Any]) -> PolicyChain:
    """A chain built from config the way `kvproxy serve` builds the `defaults` one."""
    routing = build_routing({"mode": "enforce", "policies": list(policies)}, None, ROOT)
    return routing.chain_for(TOPIC)


def without_count_check(policies: Sequence[Any]) -> list[Any]:
    """The same policies with `batch_integrity`'s count check switched off."""
    return [
        {"batch_integrity": {"check_count": False}} if name == "batch_integrity" else name
        for name in policies
    ]


COUNT_CHECK_CHAINS: dict[str, Sequence[Any]] = {
    "default chain": DEFAULT_POLICIES,
    "default chain, LogAppendTime": (
        "batch_integrity",
        "crc",
        {"timestamps": {"type": "LogAppendTime"}},
        "compacted_key",
    ),
    "batch_integrity, crc": BATCH_LEVEL_POLICIES,
}
"""(e): the chains timed with and without the count check."""


def check(chain: PolicyChain, raw: bytes, *, compacted: bool) -> Verdict:
    """One partition of one Produce v9 request: fresh batch views, then the chain's verdict."""
    produced = parse_records(
        TOPIC,
        0,
        raw,
        produce_version=9,
        acks=-1,
        transactional_id=None,
        compacted=compacted,
        now_ms=int(time.time() * 1000),
    )
    if not isinstance(produced, ProducedRecords):
        return produced
    return chain.check(produced)


def make_engine(policies: Sequence[str] | None = None) -> ProduceEngine:
    """The proxy's engine with `policies` for every topic (None: the default chain), none
    compacted."""
    defaults = None if policies is None else {"mode": "enforce", "policies": list(policies)}
    return ProduceEngine(build_routing(defaults, None, ROOT), ProduceSettings(), lambda _: False)


def handle_produce(engine: ProduceEngine, frame: bytes) -> ProduceDecision:
    """What kvproxy/proxy/produce/exchange.py does with a Produce frame before sending anything."""
    return engine.decide(frame, decode_request(frame))


def produce_frame(
    *batches: bytes, topic: str = TOPIC, correlation_id: int = 1, client_id: str = "kvproxy-bench"
) -> bytes:
    """A Produce v9 request (acks=all) with partition i of `topic` carrying `batches[i]`."""
    body = produce_v9.ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=(
            produce_v9.TopicProduceData(
                name=TopicName(topic),
                partition_data=tuple(
                    produce_v9.PartitionProduceData(index=i32(index), records=Records(batch))
                    for index, batch in enumerate(batches)
                ),
            ),
        ),
    )
    return encode_request(make_request(PRODUCE, 9, correlation_id, client_id, body))


def accepted(verdict: Verdict) -> None:
    if not verdict.ok:
        raise AssertionError(f"the benchmark input was rejected: {verdict}")


def engine_check(chain: PolicyChain, raw: bytes, *, compacted: bool) -> Callable[[], None]:
    def run() -> None:
        accepted(check(chain, raw, compacted=compacted))

    return run


def engine_request(engine: ProduceEngine, frame: bytes) -> Callable[[], None]:
    def run() -> None:
        decision = handle_produce(engine, frame)
        # The original frame goes upstream only when every partition was accepted (enforce).
        if decision.forward is not frame:
            raise AssertionError(f"the benchmark request was not forwarded as is: {decision}")

    return run


def decode_only(frame: bytes) -> Callable[[], None]:
    def run() -> None:
        decode_request(frame)

    return run


def crc_only(batch: bytes) -> Callable[[], None]:
    view = memoryview(batch)

    def run() -> None:
        crc32c.crc32c(view)

    return run


def copy_only(batch: bytes) -> Callable[[], None]:
    source = bytearray(batch)

    def run() -> None:
        bytes(source)

    return run


def parser_count(batch: bytes, expected: int) -> Callable[[], None]:
    def run() -> None:
        count = 0
        for _ in DefaultRecordBatch(batch):
            count += 1
        if count != expected:
            raise AssertionError(f"C parser read {count} of {expected} records")

    return run


def parser_fields(batch: bytes, expected: int) -> Callable[[], None]:
    def run() -> None:
        count = 0
        for record in DefaultRecordBatch(batch):
            record.timestamp  # noqa: B018  # the read is what is timed
            record.key  # noqa: B018
            count += 1
        if count != expected:
            raise AssertionError(f"C parser read {count} of {expected} records")

    return run


def decompress_only(codec: Codec, batch: bytes) -> Callable[[], None]:
    payload = memoryview(batch)[V2_HEADER_SIZE:]

    def run() -> None:
        decompress(codec, payload)

    return run


def decompress_count(codec: Codec, batch: bytes, plain: bytes, expected: int) -> Callable[[], None]:
    """Decompress, then count the records with the C parser, behind the header of `plain` (the
    same batch uncompressed: attributes without codec bits), as `kvproxy.protocol.records` does."""
    payload = memoryview(batch)[V2_HEADER_SIZE:]
    header = plain[:V2_HEADER_SIZE]

    def run() -> None:
        count = 0
        for _ in DefaultRecordBatch(header + decompress(codec, payload)):
            count += 1
        if count != expected:
            raise AssertionError(f"C parser read {count} of {expected} records")

    return run
