"""FrameDecoder's small frames: a read that holds whole frames is cut into them where it landed
(the scratch shared by the decoders of a pool), and only what is left of a frame is kept."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from kvproxy.protocol.errors import FrameTooLarge
from kvproxy.protocol.framing import BufferPool, FrameDecoder, frame


def _read(decoder: FrameDecoder, data: bytes) -> list[bytes]:
    """One read as the event loop makes it, then every frame it completed."""
    view = decoder.get_buffer()
    view[: len(data)] = data
    del view
    decoder.buffer_updated(len(data))
    got: list[bytes] = []
    while (item := decoder.next_frame()) is not None:
        got.append(bytes(item))
    return got


def test_a_read_of_whole_frames_is_not_copied_before_it_is_cut() -> None:
    decoder = FrameDecoder(pool=BufferPool())
    payloads = [bytes([n]) * 1000 for n in range(60)]
    data = b"".join(frame(p) for p in payloads)
    view = decoder.get_buffer()
    view[: len(data)] = data
    del view
    tracemalloc.start()
    try:
        decoder.buffer_updated(len(data))
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 1000  # not the read's 60 KB
    got = []
    while (item := decoder.next_frame()) is not None:
        got.append(item)
    assert got == payloads and decoder.buffered == 0


def test_decoders_sharing_the_scratch_keep_their_own_parts_of_frames() -> None:
    pool = BufferPool()
    rng = random.Random(5)
    decoders = [FrameDecoder(pool=pool) for _ in range(3)]
    payloads = [[rng.randbytes(rng.randrange(300)) for _ in range(200)] for _ in decoders]
    streams = [b"".join(frame(p) for p in mine) for mine in payloads]
    positions = [0] * len(decoders)
    got: list[list[bytes]] = [[] for _ in decoders]
    while any(p < len(s) for p, s in zip(positions, streams, strict=True)):
        index = rng.randrange(len(decoders))
        position, stream = positions[index], streams[index]
        size = min(rng.randrange(1, 2000), len(stream) - position)
        if size > 0:
            got[index] += _read(decoders[index], stream[position : position + size])
            positions[index] += size
            # buffered counts the part of a frame kept, whichever decoder reads next
            assert decoders[index].buffered == position + size - sum(4 + len(p) for p in got[index])
    assert got == payloads


def test_a_frame_above_the_maximum_within_one_read_still_raises() -> None:
    decoder = FrameDecoder(max_frame_size=100, pool=BufferPool())
    assert _read(decoder, frame(b"a" * 100)) == [b"a" * 100]
    with pytest.raises(FrameTooLarge):
        _read(decoder, frame(b"b" * 101) + frame(b"c"))


def test_the_part_of_a_frame_left_in_a_read_is_kept_for_receive_data_too() -> None:
    decoder = FrameDecoder()
    data = frame(b"first") + frame(b"second")
    assert _read(decoder, data[:-3]) == [b"first"]
    assert decoder.buffered == 4 + len(b"second") - 3
    decoder.receive_data(data[-3:])
    assert decoder.next_frame() == b"second"
    assert decoder.next_frame() is None and decoder.buffered == 0
