"""Kafka framing: each request and response is a 4-byte big-endian size, then that many bytes.

`FrameDecoder` is sans-IO in the h11 style: the caller feeds whatever bytes arrived with
`receive_data` and pulls complete frames with `next_frame`. A size prefix above the configured
maximum (Kafka's `socket.request.max.bytes`, 100 MiB by default) or below zero raises before any
of the body is buffered, so a hostile size cannot make the caller allocate.

For large frames (produce requests, fetch answers) the decoder can also be filled the way
`asyncio.BufferedProtocol` fills a buffer: `get_buffer()` hands out a writable view and
`buffer_updated(n)` says how much of it was written. Once a frame above `LARGE_FRAME` bytes has
begun, its bytes go straight into a buffer of its own, which becomes the frame: the socket's bytes
are copied once, by the kernel, and never again on their way through the proxy.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from typing import Final

from kvproxy.protocol.budget import MemoryBudget
from kvproxy.protocol.errors import FrameTooLarge, NegativeSize

SIZE_PREFIX: Final = 4
DEFAULT_MAX_FRAME_SIZE: Final = 100 * 1024 * 1024
LARGE_FRAME: Final = 64 * 1024
"""Frames above this size are received into a buffer of their own (no copy out)."""
INITIAL_LARGE_BUFFER: Final = 64 * 1024
"""A large frame's buffer starts this big (or as big as what has already arrived) and doubles as
its bytes arrive, so a size prefix alone commits no more than this."""
_SCRATCH_SIZE: Final = 64 * 1024
_SIZE = struct.Struct(">i")


def pooled_size(size: int) -> int:
    """`size` rounded up to its size class: eight classes between two powers of two (at most an
    eighth more), so that frames of about one size share their pooled buffers."""
    step = 1 << max(12, (size - 1).bit_length() - 4)
    return -(-size // step) * step


Frame = bytes | memoryview
"""A frame's payload: bytes for small frames, a read-only view of its own buffer for large ones."""


class BufferPool:
    """Buffers shared by the decoders of one thread (one event loop): a scratch area for reads
    and large-frame buffers that are used again once nothing refers to them.

    A fresh megabyte costs its page faults and its zeroing on every frame (a seventh of the
    proxy's time at 1 MiB requests, measured); a buffer that comes back costs neither. A buffer
    is free when the pool holds the only reference: no frame view of it is alive anywhere (the
    transport's write queue included). Bounded in count and bytes; beyond that, frames get
    buffers of their own as without a pool.

    The count bound allows the byte bound's worth of 1 MiB buffers: a buffer stays referenced
    until the broker answers its request (the decision keeps views of it), and against Kafka
    with acks=all one producer connection holds about 25 requests of 1 MiB in the proxy at once.
    """

    __slots__ = (
        "_buffers",
        "_bytes",
        "_scratch",
        "growths",
        "max_buffers",
        "max_bytes",
        "new_buffers",
    )

    def __init__(self, max_buffers: int = 64, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_buffers = max_buffers
        self.max_bytes = max_bytes
        self._buffers: list[bytearray] = []
        self._bytes = 0
        self._scratch = bytearray(_SCRATCH_SIZE)
        self.new_buffers = 0
        """Large-frame buffers allocated so far (none came back that fitted)."""
        self.growths = 0
        """Times a large frame outgrew its buffer (a copy into a larger one)."""

    @property
    def scratch(self) -> bytearray:
        """Where a read lands before `buffer_updated` copies it out; shared, as the event loop
        handles one read at a time."""
        return self._scratch

    def take(self, least: int, fits: int, most: int) -> bytearray:
        """A buffer for a frame of `fits` bytes (contents undefined): the smallest free pooled
        one of `fits` to `most` bytes (the frame needs no more), else the largest free one of
        `least` to `fits` bytes (the frame grows from there), else a new one of `least` bytes.

        Best fit, not first: frames of one client vary by a few bytes, and a buffer exactly as
        large as an earlier frame is a byte short for a later one more often than not."""
        best: bytearray | None = None
        best_rank = (2, 0)
        for buffer in self._buffers:
            length = len(buffer)
            # referents: the pool's list, the loop variable, getrefcount's argument
            if least <= length <= most and sys.getrefcount(buffer) <= 3:
                rank = (0, length) if length >= fits else (1, -length)
                if rank < best_rank:
                    best, best_rank = buffer, rank
        if best is not None:
            return best
        buffer = bytearray(least)
        self.new_buffers += 1
        if len(self._buffers) < self.max_buffers and self._bytes + least <= self.max_bytes:
            self._buffers.append(buffer)
            self._bytes += least
        return buffer

    def grown(self, old: bytearray, new: bytearray) -> None:
        """`new` (a larger copy of `old`) takes `old`'s place in the pool, if `old` was pooled
        and the pool's byte bound allows; else `old` just leaves the pool."""
        self.growths += 1
        self.new_buffers += 1
        for index, buffer in enumerate(self._buffers):
            if buffer is old:
                if self._bytes - len(old) + len(new) <= self.max_bytes:
                    self._buffers[index] = new
                    self._bytes += len(new) - len(old)
                else:
                    del self._buffers[index]
                    self._bytes -= len(old)
                return

    @property
    def pooled_bytes(self) -> int:
        return self._bytes


class FrameDecoder:
    """Splits a byte stream into frame payloads (size prefix removed)."""

    __slots__ = (
        "_budget",
        "_buffer",
        "_in_scratch",
        "_large",
        "_large_filled",
        "_large_size",
        "_max_frame_size",
        "_pool",
        "_reserved",
        "_scratch",
        "_scratch_start",
        "_start",
        "reservations",
        "waiting",
    )

    def __init__(
        self,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        pool: BufferPool | None = None,
        budget: MemoryBudget | None = None,
    ) -> None:
        """`budget`: large frames being received reserve their declared size in it before their
        buffer is started (their buffers still grow only with what arrives). A frame that
        cannot reserve waits, its bytes kept, with `waiting` set to its size; the caller stops
        reading and calls `next_frame` again once the budget has room. A frame that has its
        reservation always completes, so frames never wait for each other's memory forever."""
        if max_frame_size <= 0:
            raise ValueError("max_frame_size must be positive")
        self._max_frame_size = max_frame_size
        self._pool = pool
        self._budget = budget
        self._reserved = 0
        self.reservations = 0
        """Large frames that have reserved `budget` so far: tells one such frame from the next."""
        self.waiting: int | None = None
        """The size of a large frame waiting for `budget` to have room, else None."""
        self._buffer = bytearray()
        self._start = 0
        self._scratch: bytearray | None = None if pool is None else pool.scratch
        self._in_scratch = 0
        """Where the last read ends in the scratch while frames are still cut from it there (0:
        none are); `_scratch_start` is where the next one begins."""
        self._scratch_start = 0
        self._large: bytearray | None = None
        self._large_size = 0
        self._large_filled = 0

    @property
    def max_frame_size(self) -> int:
        return self._max_frame_size

    @property
    def reserved_frame(self) -> int | None:
        """Which reservation (its number in `reservations`) the frame being received holds, or
        None when no frame holds `budget`."""
        return self.reservations if self._reserved else None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        in_scratch = self._in_scratch - self._scratch_start if self._in_scratch else 0
        return len(self._buffer) - self._start + self._large_filled + in_scratch

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._in_scratch:
            self._keep_scratch()
        if self._large is not None:
            taken = self._fill_large(data)
            if taken == len(data):
                return
            data = memoryview(data)[taken:]
        self._buffer += data

    # -- asyncio.BufferedProtocol style ---------------------------------------------------------

    def get_buffer(self) -> memoryview:
        """Where the next bytes from the socket should go (at least one byte of room). After
        `buffer_updated`, call `next_frame` until it returns None before the next read: a read
        that holds only whole frames is not copied out of the scratch, which the next read of
        any decoder sharing the pool overwrites."""
        large = self._large
        if large is not None:
            filled = self._large_filled
            end = min(len(large), self._large_size)
            if filled == end:  # grow: the frame is longer than what was committed so far
                large = self._grow(filled + 1)
                end = min(len(large), self._large_size)
            return memoryview(large)[filled:end]
        if self._scratch is None:
            self._scratch = bytearray(_SCRATCH_SIZE)
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> None:
        """`nbytes` were written into the view `get_buffer()` returned."""
        if self._large is not None:
            self._large_filled += nbytes
        elif self._buffer:  # after the part of a frame kept from earlier reads
            assert self._scratch is not None
            with memoryview(self._scratch) as view:
                self._buffer += view[:nbytes]
        else:  # frames are cut from the scratch itself; what is left of them is kept
            self._in_scratch = nbytes

    # -- frames ---------------------------------------------------------------------------------

    def pending_frame_size(self) -> int | None:
        """Size of the frame being received, once its prefix is in; validated like `next_frame`."""
        if self._large is not None:
            return self._large_size
        if len(self._buffer) - self._start < SIZE_PREFIX:
            return None
        (size,) = _SIZE.unpack_from(self._buffer, self._start)
        self._check_size(size)
        return int(size)

    def next_frame(self) -> Frame | None:
        """The next complete frame's payload, or None until more data arrives."""
        if self._large is not None:
            if self._large_filled < self._large_size:
                return None
            with memoryview(self._large) as whole:
                payload = whole[: self._large_size].toreadonly()
            self._large = None
            self._large_size = self._large_filled = 0
            self.release()
            return payload
        if self._in_scratch and (cut := self._scratch_frame()) is not None:
            return cut
        if len(self._buffer) - self._start < SIZE_PREFIX:
            return None  # no prefix yet: the common end of a read (`pending_frame_size`'s test)
        size = self.pending_frame_size()
        if size is None:
            return None
        begin = self._start + SIZE_PREFIX
        end = begin + size
        buffer = self._buffer
        if end > len(buffer):
            if size > LARGE_FRAME:  # the rest of this frame goes straight into its own buffer
                budget = self._budget
                if budget is not None and not budget.try_take(size):
                    self.waiting = size
                    return None
                self.waiting = None
                self._reserved = size if budget is not None else 0
                self.reservations += 1
                initial = max(INITIAL_LARGE_BUFFER, len(buffer) - begin)  # < size
                if self._pool is None:
                    self._large = bytearray(initial)
                else:  # a free pooled buffer commits nothing new, whatever its size
                    most = max(2 * size, 4 * initial)
                    self._large = self._pool.take(initial, size, most)
                self._large_size = size
                with memoryview(buffer) as view:
                    self._fill_large(view[begin:])  # all of it: the frame ends further on
                buffer.clear()
                self._start = 0
            return None
        with memoryview(buffer) as view:
            frame = bytes(view[begin:end])
        self._consume(end)
        return frame

    def _scratch_frame(self) -> bytes | None:
        """The next whole frame of the read still in the scratch; else None, with what is left
        of the read kept in `_buffer` (and checked there, as the scratch takes the next read)."""
        scratch = self._scratch
        assert scratch is not None
        start, end_of_read = self._scratch_start, self._in_scratch
        if end_of_read - start >= SIZE_PREFIX:
            (size,) = _SIZE.unpack_from(scratch, start)
            end = start + SIZE_PREFIX + size
            if 0 <= size <= self._max_frame_size and end <= end_of_read:
                with memoryview(scratch) as view:
                    whole = bytes(view[start + SIZE_PREFIX : end])
                if end == end_of_read:
                    self._in_scratch = self._scratch_start = 0
                else:
                    self._scratch_start = end
                return whole
        self._keep_scratch()
        return None

    def _keep_scratch(self) -> None:
        """Copy what is left of the read in the scratch into `_buffer` (empty meanwhile)."""
        assert self._scratch is not None
        with memoryview(self._scratch) as view:
            self._buffer += view[self._scratch_start : self._in_scratch]
        self._in_scratch = self._scratch_start = 0

    def _grow(self, needed: int) -> bytearray:
        """A larger buffer for the frame being received, holding what it has so far: twice as
        large (what is committed stays within twice what arrived), at least `needed` bytes, at
        most the frame's size rounded up to its size class (`pooled_size`) when the buffer is
        pooled, so that it fits later frames a few bytes longer."""
        old = self._large
        assert old is not None
        size = self._large_size
        pool = self._pool
        most = size if pool is None else pooled_size(size)
        new = self._large = bytearray(min(max(2 * len(old), needed), most))
        filled = self._large_filled
        new[:filled] = memoryview(old)[:filled]
        if pool is not None:
            pool.grown(old, new)
        return new

    def release(self) -> None:
        """Give back the budget reserved by the frame being received (it completed, or the
        connection is closing)."""
        if self._reserved and self._budget is not None:
            self._budget.give_back(self._reserved)
        self._reserved = 0

    def _fill_large(self, data: bytes | bytearray | memoryview) -> int:
        """Copy what belongs to the large frame from `data`; returns how many bytes it took."""
        large = self._large
        assert large is not None
        filled = self._large_filled
        taken = min(len(data), self._large_size - filled)
        if filled + taken > len(large):
            large = self._grow(filled + taken)
        large[filled : filled + taken] = memoryview(data)[:taken]
        self._large_filled = filled + taken
        return taken

    def _consume(self, end: int) -> None:
        self._start = end
        if self._start == len(self._buffer):
            self._buffer.clear()
            self._start = 0
        elif self._start > 65536 and self._start * 2 > len(self._buffer):
            del self._buffer[: self._start]
            self._start = 0

    def _check_size(self, size: int) -> None:
        if size < 0:
            raise NegativeSize(f"frame size {size} is negative{_foreign_hint(size)}")
        if size > self._max_frame_size:
            raise FrameTooLarge(
                f"frame size {size} is larger than the maximum {self._max_frame_size}"
                + _foreign_hint(size)
            )


_FOREIGN_PREFIXES: Final = (
    (b"HTTP", "HTTP (an HTTP server's answer)"),
    (b"GET ", "HTTP (a request)"),
    (b"POST", "HTTP (a request)"),
    (b"PUT ", "HTTP (a request)"),
    (b"HEAD", "HTTP (a request)"),
    (b"PRI ", "HTTP/2"),
    (b"SSH-", "SSH"),
    (b"\x16\x03", "TLS (a handshake: one side uses TLS, the other does not)"),
    (b"\x15\x03", "TLS (an alert: one side uses TLS, the other does not)"),
)


def foreign_protocol(prefix: bytes) -> str | None:
    """The protocol a peer's first bytes look like when they are not Kafka (None: no guess).

    A Kafka peer's first four bytes are a frame size; those of HTTP or TLS read as sizes far
    above any maximum, so the size check is where a peer that does not speak Kafka shows."""
    for start, name in _FOREIGN_PREFIXES:
        if prefix.startswith(start):
            return name
    return None


def _foreign_hint(size: int) -> str:
    prefix = _SIZE.pack(size)
    name = foreign_protocol(prefix)
    if name is None:
        return ""
    return f": the peer does not speak Kafka (its first bytes {prefix!r} look like {name})"


def write_frame(out: bytearray, payload: bytes | bytearray | memoryview) -> None:
    """Append `payload` with its size prefix to `out`."""
    out += _SIZE.pack(len(payload))
    out += payload


def size_prefix(payload: bytes | bytearray | memoryview) -> bytes:
    """The 4-byte size prefix of `payload` (to send beside it, without copying the payload)."""
    return _SIZE.pack(len(payload))


pack_size: Callable[[int], bytes] = _SIZE.pack
"""The 4-byte size prefix of a payload of this many bytes (`size_prefix` without its Python
call, for the relay's per-request writes)."""


def frame(payload: bytes | bytearray | memoryview) -> bytes:
    """`payload` with its size prefix, as one bytes object."""
    out = bytearray()
    write_frame(out, payload)
    return bytes(out)
