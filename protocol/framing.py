"""Kafka framing: each request and response is a 4-byte big-endian size, then that many bytes.

`FrameDecoder` is sans-IO in the h11 style: the caller feeds whatever bytes arrived with
`receive_data` and pulls complete frames with `next_frame`. A size prefix above the configured
maximum (Kafka's `socket.request.max.bytes`, 100 MiB by default) or below zero raises before any
of the body is buffered, so a hostile size cannot make the caller allocate.
"""

from __future__ import annotations

import struct
from typing import Final

from protocol.errors import FrameTooLarge, NegativeSize

SIZE_PREFIX: Final = 4
DEFAULT_MAX_FRAME_SIZE: Final = 100 * 1024 * 1024
_SIZE = struct.Struct(">i")


class FrameDecoder:
    """Splits a byte stream into frame payloads (size prefix removed)."""

    __slots__ = ("_buffer", "_max_frame_size", "_start")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size <= 0:
            raise ValueError("max_frame_size must be positive")
        self._max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._start = 0

    @property
    def max_frame_size(self) -> int:
        return self._max_frame_size

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buffer) - self._start

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    def pending_frame_size(self) -> int | None:
        """Size of the frame being received, once its prefix is in; validated like `next_frame`."""
        if self.buffered < SIZE_PREFIX:
            return None
        (size,) = _SIZE.unpack_from(self._buffer, self._start)
        self._check_size(size)
        return int(size)

    def next_frame(self) -> bytes | None:
        """The next complete frame's payload, or None until more data arrives."""
        size = self.pending_frame_size()
        if size is None:
            return None
        begin = self._start + SIZE_PREFIX
        end = begin + size
        if end > len(self._buffer):
            return None
        frame = bytes(self._buffer[begin:end])
        self._start = end
        if self._start == len(self._buffer):
            self._buffer.clear()
            self._start = 0
        elif self._start > 65536 and self._start * 2 > len(self._buffer):
            del self._buffer[: self._start]
            self._start = 0
        return frame

    def _check_size(self, size: int) -> None:
        if size < 0:
            raise NegativeSize(f"frame size {size} is negative")
        if size > self._max_frame_size:
            raise FrameTooLarge(
                f"frame size {size} is larger than the maximum {self._max_frame_size}"
            )


def write_frame(out: bytearray, payload: bytes | bytearray | memoryview) -> None:
    """Append `payload` with its size prefix to `out`."""
    out += _SIZE.pack(len(payload))
    out += payload


def frame(payload: bytes | bytearray | memoryview) -> bytes:
    """`payload` with its size prefix, as one bytes object."""
    out = bytearray()
    write_frame(out, payload)
    return bytes(out)
