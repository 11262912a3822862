"""`kvproxy dump PATH...`: decode Kafka log segments, like Kafka's kafka-dump-log.

A PATH is a segment file or a `<topic>-<partition>` directory (its `*.log` files, in base-offset
order). A corrupt or truncated file is reported on stderr with the byte position of the first bad
batch and the scan goes on with the next file; a batch with a bad CRC is reported too, and the
file's later batches are still read. A PATH that does not exist is reported and exits 2 (a usage
error, as a bad argument); a directory with no `*.log` file is reported too, so that a mistyped
folder is never taken for an empty log. Otherwise the exit code is 1 if any file had errors or any
directory had no segment, else 0. Every existing PATH is dumped in any case.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from protocol.compression import Codec
from protocol.errors import DecodeError
from protocol.records import Record, RecordBatch, read_batch

PREVIEW_CHARS = 40


@dataclass
class DumpSummary:
    """Totals over every file scanned; what `--json` prints.

    `errors` holds one entry per file that stopped decoding (the position of the first bad
    batch) and one per batch whose CRC does not match.
    """

    files: int = 0
    batches: int = 0
    records: int = 0
    null_keys: int = 0
    crc_errors: int = 0
    control_batches: int = 0
    magics: set[int] = field(default_factory=set)
    codecs: set[str] = field(default_factory=set)
    errors: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "batches": self.batches,
            "records": self.records,
            "null_keys": self.null_keys,
            "crc_errors": self.crc_errors,
            "magics": sorted(self.magics),
            "codecs": sorted(self.codecs),
            "control_batches": self.control_batches,
            "errors": self.errors,
        }


def add_parser(subparsers: Any) -> None:
    """Register the `dump` subcommand on an argparse subparsers object."""
    parser = subparsers.add_parser(
        "dump",
        help="decode Kafka log segments",
        description="Decode Kafka log segments (files or <topic>-<partition> directories).",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", type=Path)
    parser.add_argument("--records", action="store_true", help="also print one line per record")
    parser.add_argument("--json", action="store_true", help="print only a JSON summary")
    parser.set_defaults(func=run)


def segment_files(paths: list[Path]) -> Iterator[Path]:
    """Files named on the command line, and the `*.log` files of directories by base offset."""
    for path in paths:
        if path.is_dir():
            yield from sorted(path.glob("*.log"), key=_base_offset_key)
        else:
            yield path


def _base_offset_key(path: Path) -> tuple[int, str]:
    try:
        return int(path.stem), path.name
    except ValueError:
        return -1, path.name


def run(args: argparse.Namespace) -> int:
    out: TextIO = sys.stdout
    summary = DumpSummary()
    missing = without_segments = False
    for path in args.paths:
        if not path.exists():
            print(f"kvproxy dump: {path}: no such file or directory", file=sys.stderr)
            missing = True
            continue
        files = list(segment_files([path]))
        if not files:
            print(f"kvproxy dump: no Kafka log segments (*.log) in {path}", file=sys.stderr)
            without_segments = True
        for file in files:
            _dump_file(file, summary, out=out, text=not args.json, with_records=args.records)
    if args.json:
        json.dump(summary.as_json(), out)
        out.write("\n")
    if missing:
        return 2
    return 1 if summary.errors or without_segments else 0


def _dump_file(
    path: Path, summary: DumpSummary, *, out: TextIO, text: bool, with_records: bool
) -> None:
    summary.files += 1
    try:
        data = path.read_bytes()
    except OSError as exc:
        _report(summary, path, 0, f"cannot read: {exc.strerror or exc}")
        return
    if text:
        out.write(f"Dumping {path}\n")
    position = 0
    while position < len(data):
        try:
            batch, next_position = read_batch(data, position)
            records = list(batch.records())
        except DecodeError as exc:
            _report(summary, path, position, f"{type(exc).__name__}: {exc}")
            return
        _count(summary, batch, records)
        if not (batch.crc_valid() and batch.inner_crcs_valid()):
            # The framing is intact, so the rest of the file can still be read.
            _report(
                summary,
                path,
                position,
                f"CRC mismatch (stored {batch.crc}, computed {batch.computed_crc()})",
            )
        if text:
            out.write(_batch_line(position, batch, len(records)) + "\n")
            if with_records:
                for offset, record in zip(_offsets(batch, records), records, strict=True):
                    out.write(_record_line(offset, record) + "\n")
        position = next_position


def _report(summary: DumpSummary, path: Path, position: int, error: str) -> None:
    summary.errors.append({"file": str(path), "position": position, "error": error})
    print(f"kvproxy dump: {path}: bad batch at byte {position}: {error}", file=sys.stderr)


def _count(summary: DumpSummary, batch: RecordBatch, records: list[Record]) -> None:
    summary.batches += 1
    summary.records += len(records)
    summary.null_keys += sum(1 for record in records if record.key is None)
    summary.magics.add(batch.magic)
    summary.codecs.add(batch.codec.name.lower())
    if not (batch.crc_valid() and batch.inner_crcs_valid()):
        summary.crc_errors += 1
    if batch.is_control:
        summary.control_batches += 1


def _batch_line(position: int, batch: RecordBatch, count: int) -> str:
    crc = "ok" if batch.crc_valid() and batch.inner_crcs_valid() else "BAD"
    return (
        f"position: {position} baseOffset: {batch.base_offset} lastOffset: {batch.last_offset} "
        f"magic: {batch.magic} compresscodec: {batch.codec.name.lower()} count: {count} "
        f"crc: {batch.crc} ({crc}) producerId: {batch.producer_id} "
        f"producerEpoch: {batch.producer_epoch} baseSequence: {batch.base_sequence} "
        f"isTransactional: {str(batch.is_transactional).lower()} "
        f"isControl: {str(batch.is_control).lower()} size: {batch.size}"
    )


def _offsets(batch: RecordBatch, records: list[Record]) -> list[int]:
    """Absolute offsets: magic 2 and magic 0 inner offsets are direct; magic 1 inner offsets are
    relative to the wrapper, which carries the last one."""
    if batch.magic == 2:
        return [batch.base_offset + record.offset_delta for record in records]
    if batch.codec is Codec.NONE:
        return [batch.base_offset for _ in records]
    if batch.magic == 0:
        return [record.offset_delta for record in records]
    last_inner = records[-1].offset_delta if records else 0
    return [batch.base_offset - last_inner + record.offset_delta for record in records]


def _record_line(offset: int, record: Record) -> str:
    headers = ", ".join(f"{key}={preview(value)}" for key, value in record.headers)
    return (
        f"| offset: {offset} timestamp: {record.timestamp} key: {preview(record.key)} "
        f"value: {preview(record.value)} headers: [{headers}]"
    )


def preview(data: bytes | None) -> str:
    """Printable text (truncated), else hex: enough to recognise a record at a glance."""
    if data is None:
        return "null"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        shown = text[:PREVIEW_CHARS]
        return repr(shown + ("..." if len(text) > PREVIEW_CHARS else ""))
    hexed = data[: PREVIEW_CHARS // 2].hex()
    return "0x" + hexed + ("..." if len(data) > PREVIEW_CHARS // 2 else "")
