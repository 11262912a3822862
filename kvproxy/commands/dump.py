"""`kvproxy dump PATH...`: decode Kafka log segments, like Kafka's kafka-dump-log.

A PATH is a segment file, a `<topic>-<partition>` directory (its `<offset>.log` files, in
base-offset order) or a broker's log directory (the partition folders in it, read as the audit
lists them). Each file is read one batch at a time, so memory stays bounded by the largest batch
whatever the segment's size. Each batch's CRC is checked before its records are decoded; a bad CRC
is reported and the file's later batches are still read. Bytes that do not frame a batch (a
length or magic that is broken, a file cut short) are reported as a bad region with their byte
position and skipped up to the next batch that verifies, as the audit does. Offsets must go up
from batch to batch, starting at or above the base offset the file's name gives: the offset field
is outside the CRC. A PATH that does not exist is reported and exits 2 (a usage error, as a bad
argument); a directory with no segment is reported too, so that a mistyped folder is never taken
for an empty log. Otherwise the exit code is 1 if any file had errors or any directory had no
segment, else 0. Every existing PATH is dumped in any case.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

from kvproxy.protocol.compression import Codec
from kvproxy.protocol.errors import DecodeError
from kvproxy.protocol.records import Record, RecordBatch, read_batch
from kvproxy.protocol.records.segment import (
    FRAME_HEAD,
    frame_end,
    partition_of,
    resync,
    segment_base_offset,
)

PREVIEW_CHARS = 40


@dataclass
class DumpSummary:
    """Totals over every file scanned; what `--json` prints.

    `batches` counts data batches and `control_batches` transaction markers, as the audit does;
    `records` and `null_keys` count the records of data batches whose CRC holds. `errors` holds
    one entry per problem: a bad region (bytes that do not frame a batch, skipped up to the next
    batch that verifies), a batch whose CRC does not match, a batch whose offsets go backwards
    (or below its file's base offset), a batch whose records do not decode.
    """

    files: int = 0
    batches: int = 0
    control_batches: int = 0
    records: int = 0
    null_keys: int | None = 0
    crc_errors: int = 0
    offset_errors: int = 0
    skipped_bytes: int = 0
    magics: set[int] = field(default_factory=set)
    codecs: set[str] = field(default_factory=set)
    bad_regions: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "batches": self.batches,
            "records": self.records,
            "null_keys": self.null_keys,
            "crc_errors": self.crc_errors,
            "offset_errors": self.offset_errors,
            "skipped_bytes": self.skipped_bytes,
            "magics": sorted(self.magics),
            "codecs": sorted(self.codecs),
            "control_batches": self.control_batches,
            "bad_regions": self.bad_regions,
            "errors": self.errors,
        }


@dataclass(frozen=True)
class DumpOptions:
    """What the output needs: decides how much of each batch is read."""

    text: bool
    with_records: bool
    headers_only: bool


def add_parser(subparsers: Any) -> None:
    """Register the `dump` subcommand on an argparse subparsers object."""
    parser = subparsers.add_parser(
        "dump",
        help="decode Kafka log segments",
        description=(
            "Decode Kafka log segments (files, <topic>-<partition> directories, or a broker's "
            "log directory)."
        ),
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", type=Path)
    parser.add_argument("--records", action="store_true", help="also print one line per record")
    parser.add_argument("--json", action="store_true", help="print only a JSON summary")
    parser.add_argument(
        "--headers-only",
        action="store_true",
        help="read batch headers and CRCs only: records counted from the headers, null_keys "
        "not computed (null)",
    )
    parser.set_defaults(func=run)


def segment_files(paths: list[Path]) -> Iterator[Path]:
    """Files named on the command line; the segments of a directory by base offset; for a
    broker's log directory, those of each `<topic>-<partition>` folder in it (the audit's
    listing: folders and files being deleted, moved or swapped are left out)."""
    for path in paths:
        if not path.is_dir():
            yield path
            continue
        own = _segments_in(path)
        if own:
            yield from own
            continue
        folders = [
            (owner, child)
            for child in path.iterdir()
            if child.is_dir() and (owner := partition_of(child.name)) is not None
        ]
        for _, folder in sorted(folders):
            yield from _segments_in(folder)


def _segments_in(folder: Path) -> list[Path]:
    found = [
        (base_offset, child.name, child)
        for child in folder.iterdir()
        if (base_offset := segment_base_offset(child.name)) is not None and child.is_file()
    ]
    return [path for _, _, path in sorted(found)]


def run(args: argparse.Namespace) -> int:
    out: TextIO = sys.stdout
    summary = DumpSummary()
    options = DumpOptions(
        text=not args.json, with_records=args.records, headers_only=args.headers_only
    )
    if options.headers_only:
        summary.null_keys = None
    missing = without_segments = False
    try:
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
                _dump_file(file, summary, out=out, options=options)
        if args.json:
            json.dump(summary.as_json(), out)
            out.write("\n")
        out.flush()  # here, where a closed output is caught, not at the interpreter's exit
    except BrokenPipeError:
        return _output_closed(out)
    if missing:
        return 2
    return 1 if summary.errors or without_segments else 0


def _output_closed(out: TextIO) -> int:
    """The reader left (`| head`): the output ends there, as `kafka-dump-log | head` ends with
    status 0. Nothing is said about the input, which was fine. What is still buffered goes to
    /dev/null so the interpreter's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, out.fileno())
    finally:
        os.close(devnull)
    return 0


def _dump_file(path: Path, summary: DumpSummary, *, out: TextIO, options: DumpOptions) -> None:
    """Step through the file batch by batch (one batch in memory at a time); a broken frame is
    skipped up to the next batch that verifies, as the audit does."""
    summary.files += 1
    try:
        handle = path.open("rb")
    except OSError as exc:
        _report(summary, path, 0, f"cannot read: {exc.strerror or exc}")
        return
    with handle:
        try:
            size = os.fstat(handle.fileno()).st_size
            if options.text:
                out.write(f"Dumping {path}\n")
            _scan_file(path, handle, size, summary, out=out, options=options)
        except BrokenPipeError:  # the output closed: not a fault of the input
            raise
        except OSError as exc:
            _report(summary, path, 0, f"cannot read: {exc.strerror or exc}")


def _scan_file(
    path: Path,
    handle: IO[bytes],
    size: int,
    summary: DumpSummary,
    *,
    out: TextIO,
    options: DumpOptions,
) -> None:
    def read(pos: int, count: int) -> bytes:
        handle.seek(pos)
        return handle.read(count)

    offsets = _OffsetOrder(segment_base_offset(path.name))
    position = 0
    while position < size:
        end = frame_end(read(position, FRAME_HEAD), position, size)
        if isinstance(end, DecodeError):
            resume = resync(read, position + 1, size)
            _report_region(summary, path, position, resume, f"{type(end).__name__}: {end}")
            position = resume
            continue
        data = read(position, end - position)
        try:
            batch, _ = read_batch(data)
        except DecodeError as exc:  # a codec id Kafka does not define
            _report(summary, path, position, f"{type(exc).__name__}: {exc}")
            position = end
            continue
        _dump_batch(path, position, batch, summary, offsets, out=out, options=options)
        position = end


def _dump_batch(
    path: Path,
    position: int,
    batch: RecordBatch,
    summary: DumpSummary,
    offsets: _OffsetOrder,
    *,
    out: TextIO,
    options: DumpOptions,
) -> None:
    """Count one framed batch: CRC first (kafka-dump-log's order), records only when a CRC-valid
    batch's records are asked for."""
    if batch.is_control:
        summary.control_batches += 1
    else:
        summary.batches += 1
    summary.magics.add(batch.magic)
    summary.codecs.add(batch.codec.name.lower())
    crc_error = _crc_error(batch)
    crc_ok = crc_error is None
    if crc_error is not None:
        summary.crc_errors += 1
        _report(summary, path, position, crc_error)
    else:  # a batch whose CRC fails has no offsets to trust
        offset_problem = offsets.check(position, batch)
        if offset_problem is not None:
            summary.offset_errors += 1
            _report(summary, path, position, offset_problem)
    records: list[Record] | None = None
    count: int | None = batch.record_count if batch.magic == 2 else None
    if crc_ok:
        try:
            records, count = _read_records(batch, summary, options)
        except DecodeError as exc:
            _report(summary, path, position, f"{type(exc).__name__}: {exc}")
        finally:
            batch.release()
    if options.text:
        out.write(_batch_line(position, batch, count, crc_ok) + "\n")
        if records:
            for offset, record in zip(_offsets(batch, records), records, strict=True):
                out.write(_record_line(offset, record) + "\n")


def _crc_error(batch: RecordBatch) -> str | None:
    """Why the batch's CRC fails, or None; a legacy wrapper's inner CRCs are checked once its
    own holds (that decompresses it)."""
    if not batch.crc_valid():
        return f"CRC mismatch (stored {batch.crc}, computed {batch.computed_crc()})"
    try:
        inner = batch.bad_inner_crc()
    except DecodeError:  # the wrapper does not decompress: reported with its records
        return None
    if inner is not None:
        return f"CRC mismatch in an inner message (stored {inner[0]}, computed {inner[1]})"
    return None


def _read_records(
    batch: RecordBatch, summary: DumpSummary, options: DumpOptions
) -> tuple[list[Record] | None, int]:
    """Records (when printed), and the count. Only data batches add to `records` and
    `null_keys`."""
    records: list[Record] | None = None
    if options.with_records and options.text:
        records = list(batch.records())
        count, null_keys = len(records), sum(1 for r in records if r.key is None)
    elif options.headers_only:
        count, null_keys = batch.record_count, 0
    else:
        scan = batch.scan()
        count, null_keys = scan.record_count, scan.null_keys
    if not batch.is_control:
        summary.records += count
        if summary.null_keys is not None:
            summary.null_keys += null_keys
    return records, count


class _OffsetOrder:
    """Offsets must go up from batch to batch, from the base offset the file's name gives.

    The offset field is outside the CRC, so this is the only check a changed offset meets. For
    magic 0/1 the stored offset is a wrapper's last one; it must still be above the batch before.
    """

    def __init__(self, name_offset: int | None) -> None:
        self.name_offset = name_offset
        self.last: tuple[int, int] | None = None  # (position, last offset) of the batch before

    def check(self, position: int, batch: RecordBatch) -> str | None:
        first, last = batch.base_offset, batch.last_offset
        problem = None
        if last < first:
            problem = f"lastOffset {last} is below baseOffset {first}"
        elif self.last is not None and first <= self.last[1]:
            problem = (
                f"baseOffset {first} does not follow lastOffset {self.last[1]} of the batch at "
                f"byte {self.last[0]}"
            )
        elif self.last is None and self.name_offset is not None and first < self.name_offset:
            problem = (
                f"baseOffset {first} is below {self.name_offset}, the base offset the file's "
                "name gives"
            )
        self.last = (position, last)
        return None if problem is None else f"offset out of order: {problem}"


def _report(summary: DumpSummary, path: Path, position: int, error: str) -> None:
    summary.errors.append({"file": str(path), "position": position, "error": error})
    print(f"kvproxy dump: {path}: bad batch at byte {position}: {error}", file=sys.stderr)


def _report_region(summary: DumpSummary, path: Path, start: int, end: int, error: str) -> None:
    summary.skipped_bytes += end - start
    summary.bad_regions.append(
        {"file": str(path), "start": start, "end": end, "bytes": end - start, "error": error}
    )
    summary.errors.append({"file": str(path), "position": start, "error": error})
    print(
        f"kvproxy dump: {path}: bad batch at byte {start}: {error}; "
        f"skipped {end - start} bytes to byte {end}",
        file=sys.stderr,
    )


def _batch_line(position: int, batch: RecordBatch, count: int | None, crc_ok: bool) -> str:
    crc = "ok" if crc_ok else "BAD"
    return (
        f"position: {position} baseOffset: {batch.base_offset} lastOffset: {batch.last_offset} "
        f"magic: {batch.magic} compresscodec: {batch.codec.name.lower()} "
        f"count: {'?' if count is None else count} "
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
    """UTF-8 text (truncated, line breaks and tabs escaped), else hex: enough to recognise a
    record at a glance. Text with other control characters is taken for binary."""
    if data is None:
        return "null"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(char.isprintable() or char in "\t\n\r" for char in text):
        shown = text[:PREVIEW_CHARS]
        return repr(shown + ("..." if len(text) > PREVIEW_CHARS else ""))
    hexed = data[: PREVIEW_CHARS // 2].hex()
    return "0x" + hexed + ("..." if len(data) > PREVIEW_CHARS // 2 else "")
