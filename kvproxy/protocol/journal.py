"""The quarantine journal's entry format: sans-IO, bytes in and values out.

The proxy appends one entry per quarantined partition; the audit job and the CLI read them back.
The format lives here, not in `proxy/`, so that `pipeline/` can read journals without importing
the proxy. Byte layout of one entry (all integers big-endian, as everywhere in Kafka):

    offset  size  field
    0       4     magic        b"KVQ1"
    4       4     length       uint32: number of bytes after the crc field (the body)
    8       4     crc          uint32: CRC32C (Castagnoli) of the body
    12      4     meta_length  uint32: number of metadata bytes           -- body starts here
    16      m     metadata     UTF-8 JSON object
    16+m    r     records      the partition's original records bytes (r = length - 4 - m, >= 0)

A segment file is entries back to back, nothing else. See docs/quarantine.md.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import crc32c

from kvproxy.protocol.errors import BufferUnderflow, DecodeError, EncodeError

__all__ = [
    "MAGIC",
    "MAX_LENGTH",
    "CorruptEntry",
    "encode_entry",
    "iter_entries",
    "read_entry",
    "write_entry",
]

MAGIC = b"KVQ1"
_HEADER = struct.Struct(">4sII")  # magic, length, crc
_META_LENGTH = struct.Struct(">I")
HEADER_SIZE = _HEADER.size  # 12
MAX_LENGTH = 0x7FFFFFFF
"""The largest body accepted: a length above it is corruption, never a torn tail."""


class CorruptEntry(DecodeError):
    """A journal entry whose bytes are all there but wrong: bad magic, CRC, length or metadata."""


def encode_entry(metadata: Mapping[str, Any], records: bytes | bytearray | memoryview) -> bytes:
    """One entry as bytes. EncodeError when the metadata is not JSON-able or the entry too big."""
    out = bytearray()
    write_entry(out, metadata, records)
    return bytes(out)


def write_entry(
    out: bytearray, metadata: Mapping[str, Any], records: bytes | bytearray | memoryview
) -> None:
    """Append one entry to `out` (nothing is appended when it raises EncodeError)."""
    meta = _encode_metadata(metadata)
    body_length = _META_LENGTH.size + len(meta) + len(records)
    if body_length > MAX_LENGTH:
        raise EncodeError(f"journal entry of {body_length} bytes exceeds {MAX_LENGTH}")
    crc = crc32c.crc32c(_META_LENGTH.pack(len(meta)))
    crc = crc32c.crc32c(meta, crc)
    crc = crc32c.crc32c(records, crc)
    out += _HEADER.pack(MAGIC, body_length, crc)
    out += _META_LENGTH.pack(len(meta))
    out += meta
    out += records


def _encode_metadata(metadata: Mapping[str, Any]) -> bytes:
    if not isinstance(metadata, Mapping):
        raise EncodeError(f"journal metadata must be a mapping, not {type(metadata).__name__}")
    try:
        text = json.dumps(
            dict(metadata), ensure_ascii=False, separators=(",", ":"), allow_nan=False
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise EncodeError(f"journal metadata is not JSON: {exc}") from exc
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (e.g. from surrogateescape-decoded text): \u escapes are still JSON.
        return json.dumps(
            dict(metadata), ensure_ascii=True, separators=(",", ":"), allow_nan=False
        ).encode("ascii")


def read_entry(
    buf: bytes | bytearray | memoryview, offset: int = 0
) -> tuple[tuple[dict[str, Any], bytes], int]:
    """Read the entry at `offset`: ((metadata, records), offset after it).

    BufferUnderflow when the buffer ends inside the entry (a torn tail: every proper prefix of a
    valid entry raises it); CorruptEntry when the bytes present cannot be an entry.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if offset < 0:
        raise CorruptEntry(f"negative buffer offset {offset}")
    available = len(view) - offset
    # A torn tail is a prefix of a valid entry, so whatever is there must match the magic.
    present = bytes(view[offset : offset + min(max(available, 0), len(MAGIC))])
    if present != MAGIC[: len(present)]:
        raise CorruptEntry(f"bad magic {present!r} at byte {offset}")
    if available < HEADER_SIZE:
        raise BufferUnderflow(
            f"journal entry at byte {offset} needs {HEADER_SIZE} header bytes, {available} left"
        )
    _, length, crc = _HEADER.unpack_from(view, offset)
    if length < _META_LENGTH.size or length > MAX_LENGTH:
        raise CorruptEntry(f"journal entry at byte {offset} has length {length}")
    start = offset + HEADER_SIZE
    end = start + length
    if end > len(view):
        raise BufferUnderflow(
            f"journal entry at byte {offset} needs {HEADER_SIZE + length} bytes, {available} left"
        )
    body = view[start:end]
    computed = crc32c.crc32c(body)
    if computed != crc:
        raise CorruptEntry(
            f"journal entry at byte {offset}: CRC mismatch (stored {crc}, computed {computed})"
        )
    (meta_length,) = _META_LENGTH.unpack_from(body, 0)
    if meta_length > length - _META_LENGTH.size:
        raise CorruptEntry(
            f"journal entry at byte {offset}: metadata length {meta_length} exceeds the body"
        )
    meta_end = _META_LENGTH.size + meta_length
    try:
        metadata = json.loads(bytes(body[_META_LENGTH.size : meta_end]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptEntry(f"journal entry at byte {offset}: metadata is not JSON: {exc}") from exc
    if not isinstance(metadata, dict):
        raise CorruptEntry(
            f"journal entry at byte {offset}: metadata is a {type(metadata).__name__}, "
            "not a JSON object"
        )
    return (metadata, bytes(body[meta_end:])), end


def iter_entries(
    buf: bytes | bytearray | memoryview, offset: int = 0
) -> Iterator[tuple[int, int, dict[str, Any], bytes]]:
    """(start, end, metadata, records) of every entry from `offset` until the buffer ends.

    Raises BufferUnderflow (torn tail) or CorruptEntry at the first bad entry, after yielding
    every good entry before it (so the last `end` yielded is where the good bytes stop).
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    while offset < len(view):
        (metadata, records), end = read_entry(view, offset)
        yield offset, end, metadata, records
        offset = end
