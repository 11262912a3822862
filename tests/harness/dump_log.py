"""Read the text of Kafka's kafka-dump-log (`DumpLogSegments --deep-iteration --print-data-log`)
and of `kvproxy dump --records` into the same shape, so a test can compare batch by batch and
record by record what each tool saw in a segment the broker wrote."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.kafka_broker import KAFKA_3, KafkaCluster

DUMP_CLASS = {KAFKA_3: "kafka.tools.DumpLogSegments"}
"""kafka-dump-log's main class; from Kafka 4.0 it lives in kafka-tools."""
DUMP_CLASS_4 = "org.apache.kafka.tools.DumpLogSegments"
CONTROL_TYPES = {0: "ABORT", 1: "COMMIT"}


@dataclass
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    header_keys: tuple[str, ...] = ()
    marker: tuple[str, int] | None = None
    """A control record's (endTxnMarker, coordinatorEpoch); key and value are then None."""


@dataclass
class Batch:
    position: int
    base_offset: int
    last_offset: int
    count: int
    magic: int
    codec: str
    crc: int
    valid: bool
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    control: bool
    size: int
    records: list[Record] = field(default_factory=list)


_FIELD = re.compile(r"(\w+): (\S+)")


def _fields(line: str) -> dict[str, str]:
    return dict(_FIELD.findall(line))


def _batch(fields: dict[str, str], crc_valid: bool) -> Batch:
    return Batch(
        position=int(fields["position"]),
        base_offset=int(fields["baseOffset"]),
        last_offset=int(fields["lastOffset"]),
        count=int(fields["count"]),
        magic=int(fields["magic"]),
        codec=fields["compresscodec"].lower(),
        crc=int(fields["crc"]),
        valid=crc_valid,
        producer_id=int(fields["producerId"]),
        producer_epoch=int(fields["producerEpoch"]),
        base_sequence=int(fields["baseSequence"]),
        transactional=fields["isTransactional"] == "true",
        control=fields["isControl"] == "true",
        size=int(fields["size"]),
    )


def parse_kafka_dump(text: str) -> dict[str, list[Batch]]:
    """kafka-dump-log's output by file: `Dumping F`, then a `baseOffset: ...` line per batch and
    a `| offset: ...` line per record (its log4j lines are skipped). Keys and values are printed
    as UTF-8 text, so the data compared is text."""
    files: dict[str, list[Batch]] = {}
    batches: list[Batch] = []
    for line in text.splitlines():
        if line.startswith("Dumping "):
            batches = files.setdefault(line.removeprefix("Dumping ").strip(), [])
        elif line.startswith("baseOffset: "):
            fields = _fields(line)
            batches.append(_batch(fields, fields["isvalid"] == "true"))
        elif line.startswith("| offset: "):
            batches[-1].records.append(_kafka_record(line))
    return files


def _kafka_record(line: str) -> Record:
    head, _, data = line.partition(" headerKeys: [")
    fields = _fields(head)
    keys_text, _, data = data.partition("]")
    header_keys = tuple(k for k in keys_text.split(",") if k)
    timestamp = int(fields.get("CreateTime", fields.get("LogAppendTime", "-1")))
    if " endTxnMarker: " in data:
        marker = _fields(data)
        return Record(
            int(fields["offset"]),
            timestamp,
            None,
            None,
            header_keys,
            (marker["endTxnMarker"], int(marker["coordinatorEpoch"])),
        )
    key_size, value_size = int(fields["keySize"]), int(fields["valueSize"])
    data = data.removeprefix(" ")
    key: bytes | None = None
    if key_size >= 0:
        key_text, _, data = data.removeprefix("key: ").partition(" payload: ")
        data = "payload: " + data if value_size >= 0 else data
        key = key_text.encode()
    value = data.removeprefix("payload: ").encode() if value_size >= 0 else None
    return Record(int(fields["offset"]), timestamp, key, value, header_keys)


def parse_kvproxy_dump(text: str) -> dict[str, list[Batch]]:
    """`kvproxy dump --records` output by file. Previews are Python literals ('text') or hex
    (0x...); a control record's key and value become its marker, as Kafka prints it."""
    files: dict[str, list[Batch]] = {}
    batches: list[Batch] = []
    for line in text.splitlines():
        if line.startswith("Dumping "):
            batches = files.setdefault(line.removeprefix("Dumping ").strip(), [])
        elif line.startswith("position: "):
            fields = _fields(line)
            crc_verdict = line.split(f"crc: {fields['crc']} (", 1)[1].split(")", 1)[0]
            batches.append(_batch(fields, crc_verdict == "ok"))
        elif line.startswith("| offset: "):
            batches[-1].records.append(_kvproxy_record(line, batches[-1].control))
    return files


_RECORD = re.compile(
    r"\| offset: (-?\d+) timestamp: (-?\d+) key: (null|0x\w*|'.*?') value: (null|0x\w*|'.*') "
    r"headers: \[(.*)\]$"
)


def _preview(text: str) -> bytes | None:
    if text == "null":
        return None
    if text.startswith("0x"):
        return bytes.fromhex(text[2:])
    return str(ast.literal_eval(text)).encode()


def _kvproxy_record(line: str, control: bool) -> Record:
    match = _RECORD.match(line)
    assert match is not None, f"not a kvproxy dump record line: {line!r}"
    offset, timestamp, key_text, value_text, headers = match.groups()
    header_keys = tuple(h.split("=", 1)[0] for h in headers.split(", ") if h)
    key, value = _preview(key_text), _preview(value_text)
    if control:
        assert key is not None and value is not None
        kind = CONTROL_TYPES[int.from_bytes(key[2:4], "big")]
        epoch = int.from_bytes(value[2:6], "big")
        return Record(int(offset), int(timestamp), None, None, header_keys, (kind, epoch))
    return Record(int(offset), int(timestamp), key, value, header_keys)


def kafka_dump(cluster: KafkaCluster, files: list[Path]) -> dict[str, list[Batch]]:
    """Run this cluster version's kafka-dump-log over `files` and parse what it prints."""
    main_class = DUMP_CLASS.get(cluster.version, DUMP_CLASS_4)
    done = cluster.tool(
        main_class,
        "--files",
        ",".join(str(f) for f in files),
        "--deep-iteration",
        "--print-data-log",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return parse_kafka_dump(done.stdout)


def kvproxy_dump(files: list[Path]) -> tuple[int, dict[str, list[Batch]]]:
    """`kvproxy dump --records` over `files`: its exit code and what it prints, parsed."""
    done = subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "dump", "--records", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return done.returncode, parse_kvproxy_dump(done.stdout)
