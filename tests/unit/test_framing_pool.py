"""BufferPool: large-frame buffers come back, so a steady stream of large frames (Produce
requests of about a batch each, their sizes varying by a few hundred bytes) is received into
buffers used before, without a fresh allocation or a copy into a grown buffer."""

from __future__ import annotations

import os
import random
import struct

from kvproxy.protocol.framing import (
    INITIAL_LARGE_BUFFER,
    LARGE_FRAME,
    BufferPool,
    Frame,
    FrameDecoder,
    frame,
)

MIB = 1024 * 1024
_BODY = os.urandom(MIB + 4096)


def _payload(size: int, number: int) -> bytes:
    return struct.pack(">i", number) + _BODY[: size - 4]


def _receive(decoder: FrameDecoder, stream: bytes, read: int = 65536) -> list[Frame]:
    """Fill the decoder as the event loop does (get_buffer, a read of up to `read` bytes,
    buffer_updated); the frames themselves, views of their buffers, are returned."""
    got: list[Frame] = []
    position = 0
    while position < len(stream):
        view = decoder.get_buffer()
        size = min(len(view), read, len(stream) - position)
        view[:size] = stream[position : position + size]
        del view
        decoder.buffer_updated(size)
        position += size
        while (item := decoder.next_frame()) is not None:
            got.append(item)
    return got


def _batch_sizes(count: int, seed: int) -> list[int]:
    """Sizes of Produce requests carrying a batch of about 1 MiB: a few hundred bytes either
    side of it, in no order."""
    rng = random.Random(seed)
    return [MIB - 1500 + rng.randrange(2000) for _ in range(count)]


def test_after_a_warm_up_frames_of_varying_size_reuse_buffers_and_never_grow() -> None:
    pool = BufferPool()
    decoder = FrameDecoder(pool=pool)
    warm_up = [*_batch_sizes(8, 1), MIB + 500]  # up to the largest size sent later
    for number, size in enumerate(warm_up):
        assert _receive(decoder, frame(_payload(size, number))) == [_payload(size, number)]
    new_buffers, growths = pool.new_buffers, pool.growths
    for number, size in enumerate(_batch_sizes(50, 2)):
        (got,) = _receive(decoder, frame(_payload(size, number)))
        assert len(got) == size and got[:4] == struct.pack(">i", number)
        del got  # forwarded and written: nothing refers to its buffer any more
    assert (pool.new_buffers, pool.growths) == (new_buffers, growths)


def test_frames_in_flight_keep_their_buffers_and_later_ones_reuse_those_released() -> None:
    pool = BufferPool()
    decoder = FrameDecoder(pool=pool)
    in_flight: list[tuple[bytes, Frame]] = []  # views alive until the broker answers
    sizes = [MIB + 500] * 6 + _batch_sizes(60, 3)  # as many as are in flight, of the largest
    for number, size in enumerate(sizes):
        if number == 6:  # warmed up
            new_buffers, growths = pool.new_buffers, pool.growths
        payload = _payload(size, number)
        in_flight += [(payload, got) for got in _receive(decoder, frame(payload), read=200_000)]
        if len(in_flight) > 5:
            sent, held = in_flight.pop(0)
            assert held == sent  # not overwritten by a later frame while it was in flight
            del held  # answered: its buffer is free
    assert all(held == sent for sent, held in in_flight)
    assert (pool.new_buffers, pool.growths) == (new_buffers, growths)


def test_a_pooled_buffer_larger_than_the_frame_hands_out_only_the_frames_bytes() -> None:
    pool = BufferPool()
    decoder = FrameDecoder(pool=pool)
    big, small = _payload(MIB, 1), _payload(MIB // 2 + 1, 2)
    assert _receive(decoder, frame(big)) == [big]
    new_buffers = pool.new_buffers
    stream = frame(small) + frame(b"next")
    assert _receive(decoder, stream, read=len(stream)) == [small, b"next"]
    assert pool.new_buffers == new_buffers  # received into the large frame's buffer


def test_a_free_pooled_buffer_serves_no_frame_of_less_than_half_its_size() -> None:
    pool = BufferPool()
    decoder = FrameDecoder(pool=pool)
    assert _receive(decoder, frame(_payload(MIB, 1))) == [_payload(MIB, 1)]
    new_buffers = pool.new_buffers
    small = _payload(LARGE_FRAME * 3, 2)
    assert _receive(decoder, frame(small)) == [small]
    assert pool.new_buffers > new_buffers


def test_a_size_prefix_alone_commits_no_more_than_the_initial_buffer_after_warm_up() -> None:
    pool = BufferPool(max_buffers=1)
    decoder = FrameDecoder(pool=pool)
    held = _receive(decoder, frame(_payload(MIB, 1)))  # the pool's one buffer stays in use
    assert _receive(decoder, struct.pack(">i", 50 * MIB)) == []
    assert len(decoder.get_buffer()) == INITIAL_LARGE_BUFFER
    assert len(held) == 1


def test_the_pool_keeps_frames_in_flight_up_to_its_byte_bound() -> None:
    """Two producer connections with 25 requests of 1 MiB each in flight (Kafka, acks=all)."""
    pool = BufferPool()
    decoder = FrameDecoder(pool=pool)
    sizes = _batch_sizes(50, 4)
    for turn in range(2):
        if turn == 1:
            new_buffers = pool.new_buffers
        in_flight = [_receive(decoder, frame(_payload(size, n))) for n, size in enumerate(sizes)]
        assert [len(got) for (got,) in in_flight] == sizes
        del in_flight  # all answered
    assert pool.new_buffers == new_buffers
    assert pool.pooled_bytes <= pool.max_bytes
