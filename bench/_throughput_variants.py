"""The variants of benchmark 1 (bench/throughput.py) running: the broker with the floor in front
of it, kvproxy with the default checks, with the record-level policies and (`--schema`) with the
schema policy against a test registry, each checked to refuse what it is there to refuse."""

from __future__ import annotations

import argparse
import contextlib
import uuid
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Producer

from bench._brokers import BrokerUnderTest, floor_settings, upstream
from bench._producer_runs import PRODUCER_CONFIG, framed_values
from bench._relays import RECORD_LEVEL_RULE, ProxyProcess, RelayProcess, start_proxy
from tests.harness.schema_registry import TestRegistry

RECORD_LEVEL_PREFIX = "rl-"

SCHEMA_PREFIX = "sc-"

SCHEMA_RULE = """\
topics:
  - match: "{pattern}"
    policies:
      - batch_integrity
      - crc
      - timestamps
      - compacted_key
      - {{schema: {{value: required}}}}
"""
"""The `schema` variant's topic rule: the default checks, then every value's schema id."""

SCHEMA_TEXT = '{"type": "object", "title": "bench.Order"}'
"""The JSON schema every `sc-` topic's values are framed with (payloads are not checked)."""

RUN_TOKEN = uuid.uuid4().hex[:8]
"""Names this run's `schema` topics, so their subjects can be registered before the rounds."""


def topic_name(variant: str, label: str) -> str:
    if variant == "schema":  # known in advance: its subject is registered before the rounds
        return f"{SCHEMA_PREFIX}{variant}-{label}-{RUN_TOKEN}"
    prefix = RECORD_LEVEL_PREFIX if variant == "record-level" else "tp-"
    return f"{prefix}{variant}-{label}-{uuid.uuid4().hex[:8]}"


def register_schema_subjects(registry: TestRegistry, labels: list[str]) -> int:
    """SCHEMA_TEXT under `<topic>-value` of every `schema` topic the run will use; its id."""
    ids = {
        registry.register(f"{topic_name('schema', label)}-value", SCHEMA_TEXT, "JSON")
        for label in labels
    }
    if len(ids) != 1:
        raise RuntimeError(f"the registry gave several ids for one schema: {sorted(ids)}")
    return ids.pop()


def refused_value(proxy: ProxyProcess, topic: str, value: bytes, what: str) -> str:
    """The error the proxy answers a record of `value` on `topic` with: it must refuse it (the
    variant's checks are active), else `RuntimeError` naming `what` was not checked."""
    outcome: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": proxy.bootstrap, **PRODUCER_CONFIG, "retries": 0})
    producer.produce(topic, value, b"k", partition=0, on_delivery=lambda e, _m: outcome.append(e))
    if producer.flush(30) != 0 or not outcome:
        raise RuntimeError(f"{what} check: no answer for the record")
    if outcome[0] is None:
        raise RuntimeError(f"the proxy accepted {value!r}: the {what} check is not active")
    return str(outcome[0])


@dataclass
class Variants:
    """The broker and what each variant produces through (None: direct), running."""

    broker: BrokerUnderTest
    proxies: dict[str, RelayProcess | None]
    rule: str
    refusal: str
    floor_relay: dict[str, str] | None
    registry: TestRegistry | None = None
    values: dict[str, list[bytes]] = field(default_factory=dict)
    """The values of a variant that sends other ones than VALUES (`schema`: framed)."""
    schema_extra: dict[str, Any] = field(default_factory=dict)


def start_variants(stack: contextlib.ExitStack, args: argparse.Namespace) -> Variants:
    """The broker (with the floor), the default and record-level proxies (the latter checked to
    refuse), and with `--schema` the schema proxy and its registry; stopped by `stack`."""
    broker = stack.enter_context(upstream(args.upstream, floor=True))
    print(f"broker: {broker.label} {broker.version} at {broker.bootstrap}", flush=True)
    floor_relay = floor_settings(broker)
    default_proxy = stack.enter_context(start_proxy(broker.bootstrap))
    rule = RECORD_LEVEL_RULE.format(pattern=f"{RECORD_LEVEL_PREFIX}*")
    record_proxy = stack.enter_context(start_proxy(broker.bootstrap, rules=rule))
    proxies: dict[str, RelayProcess | None] = {"direct": None}
    if broker.floor is not None:
        print(f"haproxy (the floor) at {broker.floor.bootstrap}", flush=True)
        proxies["haproxy"] = broker.floor
    proxies.update({"default": default_proxy, "record-level": record_proxy})
    refusal = refused_value(
        record_proxy,
        broker.create_topic(topic_name("record-level", "refused")),
        b"not json",
        "JSON",
    )
    print(f"record-level proxy refuses a non-JSON value: {refusal}", flush=True)
    variants = Variants(broker, proxies, rule, refusal, floor_relay)
    if args.schema:
        start_schema_variant(stack, args, variants)
    return variants


def start_schema_variant(
    stack: contextlib.ExitStack, args: argparse.Namespace, variants: Variants
) -> None:
    """A test registry with this run's subjects, and a proxy checking every value's schema id
    against it (checked to refuse an unframed value)."""
    broker = variants.broker
    registry = variants.registry = stack.enter_context(TestRegistry())
    labels = ["warmup", *(f"r{rnd}" for rnd in range(1, args.rounds + 1))]
    schema_id = register_schema_subjects(registry, labels)
    variants.values["schema"] = framed_values(schema_id)
    schema_rule = SCHEMA_RULE.format(pattern=f"{SCHEMA_PREFIX}*")
    schema_proxy = stack.enter_context(
        start_proxy(
            broker.bootstrap,
            rules=schema_rule,
            extra_yaml=f"schema_registry: {{url: '{registry.url}'}}\n",
        )
    )
    variants.proxies["schema"] = schema_proxy
    schema_refusal = refused_value(
        schema_proxy, broker.create_topic(topic_name("schema", "refused")), b"no header", "schema"
    )
    print(f"schema proxy refuses an unframed value: {schema_refusal}", flush=True)
    variants.schema_extra = {"schema_rule": schema_rule, "schema_id": schema_id}
    variants.schema_extra["schema_refusal"] = schema_refusal
