"""FrameDecoder: the size prefix, the maximum frame size, and input arriving in any chunking."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvproxy.protocol.errors import DecodeError, FrameTooLarge, NegativeSize
from kvproxy.protocol.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    INITIAL_LARGE_BUFFER,
    LARGE_FRAME,
    BufferPool,
    Frame,
    FrameDecoder,
    frame,
    pooled_size,
    write_frame,
)


def test_default_maximum_is_kafkas_socket_request_max_bytes() -> None:
    assert DEFAULT_MAX_FRAME_SIZE == 104_857_600
    assert FrameDecoder().max_frame_size == DEFAULT_MAX_FRAME_SIZE


def test_whole_input_yields_each_frame_then_none() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(frame(b"first") + frame(b"") + frame(b"third"))
    assert decoder.next_frame() == b"first"
    assert decoder.next_frame() == b""
    assert decoder.next_frame() == b"third"
    assert decoder.next_frame() is None
    assert decoder.buffered == 0


def test_one_byte_at_a_time_yields_frames_exactly_when_complete() -> None:
    payloads = [b"a" * 3, b"", b"xyz" * 100]
    stream = b"".join(frame(p) for p in payloads)
    decoder = FrameDecoder()
    got: list[bytes] = []
    ends = set()
    position = 0
    for payload in payloads:
        position += 4 + len(payload)
        ends.add(position)
    for index in range(len(stream)):
        decoder.receive_data(stream[index : index + 1])
        produced = decoder.next_frame()
        if index + 1 in ends:
            assert produced is not None
            got.append(produced)
        else:
            assert produced is None
    assert got == payloads


def test_trailing_partial_frame_stays_buffered() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(frame(b"done") + struct.pack(">i", 10) + b"part")
    assert decoder.next_frame() == b"done"
    assert decoder.next_frame() is None
    assert decoder.buffered == 8
    decoder.receive_data(b"ial!!!")
    assert decoder.next_frame() == b"partial!!!"


def test_oversize_prefix_raises_before_the_body_arrives() -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    decoder.receive_data(struct.pack(">i", 1025))
    with pytest.raises(FrameTooLarge, match="1025 is larger than the maximum 1024"):
        decoder.next_frame()


def test_frame_of_exactly_the_maximum_is_accepted() -> None:
    decoder = FrameDecoder(max_frame_size=16)
    decoder.receive_data(frame(b"x" * 16))
    assert decoder.next_frame() == b"x" * 16


def test_negative_prefix_raises_decode_error() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(struct.pack(">i", -1))
    with pytest.raises(NegativeSize) as info:
        decoder.next_frame()
    assert isinstance(info.value, DecodeError)
    assert info.value.error_code == 42


def test_write_frame_appends_prefix_and_payload() -> None:
    out = bytearray(b"before")
    write_frame(out, b"abc")
    assert bytes(out) == b"before\x00\x00\x00\x03abc"


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=10),
)
@settings(max_examples=300, deadline=None)
def test_any_chunking_yields_the_same_frames(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(p) for p in payloads)
    points = sorted({0, len(stream), *(c for c in cuts if c <= len(stream))})
    decoder = FrameDecoder()
    got: list[bytes] = []
    for begin, end in itertools.pairwise(points):
        decoder.receive_data(stream[begin:end])
        while (item := decoder.next_frame()) is not None:
            got.append(item)
    assert got == payloads
    assert decoder.buffered == 0


# ---- large frames: received into a buffer of their own ----


def _payload(size: int, seed: int = 0) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(size))


def _feed_buffered(decoder: FrameDecoder, stream: bytes, chunks: list[int]) -> list[bytes]:
    """Fill the decoder the way asyncio.BufferedProtocol does: get_buffer, write, buffer_updated."""
    got: list[bytes] = []
    position = 0
    turn = 0
    while position < len(stream):
        view = decoder.get_buffer()
        assert len(view) >= 1
        size = min(len(view), chunks[turn % len(chunks)], len(stream) - position)
        turn += 1
        view[:size] = stream[position : position + size]
        del view
        decoder.buffer_updated(size)
        position += size
        while (item := decoder.next_frame()) is not None:
            got.append(bytes(item))
    return got


@pytest.mark.parametrize("chunks", [[1 << 20], [65536], [1000, 7, 131072], [1]])
def test_large_frames_through_get_buffer_in_any_chunking(chunks: list[int]) -> None:
    sizes = [5, LARGE_FRAME + 1, 3, 300_000, 0, LARGE_FRAME, 2 * LARGE_FRAME]
    if chunks == [1]:
        sizes = [5, LARGE_FRAME + 1, 3]  # one byte at a time: keep it quick
    payloads = [_payload(size, seed) for seed, size in enumerate(sizes)]
    stream = b"".join(frame(p) for p in payloads)
    decoder = FrameDecoder()
    assert _feed_buffered(decoder, stream, chunks) == payloads
    assert decoder.buffered == 0


def test_a_large_frame_is_a_read_only_view_of_its_own_buffer() -> None:
    payload = _payload(LARGE_FRAME * 3)
    decoder = FrameDecoder()
    decoder.receive_data(frame(payload)[:1000])
    assert decoder.next_frame() is None
    assert decoder.buffered == 996  # the prefix is no longer counted: the frame has begun
    decoder.receive_data(frame(payload)[1000:] + frame(b"next"))
    got = decoder.next_frame()
    assert isinstance(got, memoryview) and got.readonly
    assert got == payload
    assert decoder.next_frame() == b"next"
    assert decoder.next_frame() is None
    assert decoder.buffered == 0


def test_a_frame_beyond_the_initial_buffer_grows_as_its_bytes_arrive() -> None:
    size = INITIAL_LARGE_BUFFER * 2 + 12345
    payload = _payload(size, 7)
    stream = frame(payload) + frame(b"tail")
    decoder = FrameDecoder()
    decoder.receive_data(stream[:100])
    decoder.next_frame()
    assert len(decoder.get_buffer()) <= INITIAL_LARGE_BUFFER  # a prefix alone commits no more
    assert _feed_buffered(decoder, stream[100:], [262144]) == [payload, b"tail"]


def test_receive_data_with_trailing_bytes_after_a_large_frame() -> None:
    first, second = _payload(LARGE_FRAME + 10, 1), _payload(LARGE_FRAME + 20, 2)
    stream = frame(first) + frame(second) + struct.pack(">i", 3) + b"a"
    decoder = FrameDecoder()
    got: list[bytes] = []
    for begin in range(0, len(stream), 50_000):
        decoder.receive_data(stream[begin : begin + 50_000])
        while (item := decoder.next_frame()) is not None:
            got.append(bytes(item))
    assert got == [first, second]
    assert decoder.buffered == 5
    decoder.receive_data(b"bc")
    assert decoder.next_frame() == b"abc"


def test_oversize_prefix_through_get_buffer_raises_before_allocating() -> None:
    decoder = FrameDecoder(max_frame_size=LARGE_FRAME * 4)
    view = decoder.get_buffer()
    view[:4] = struct.pack(">i", LARGE_FRAME * 4 + 1)
    del view
    decoder.buffer_updated(4)
    with pytest.raises(FrameTooLarge):
        decoder.next_frame()


def test_a_pooled_buffer_is_used_again_only_once_no_frame_view_of_it_is_alive() -> None:
    pool = BufferPool()
    first, second = _payload(LARGE_FRAME * 2, 1), _payload(LARGE_FRAME * 2, 2)
    decoder = FrameDecoder(pool=pool)
    decoder.receive_data(frame(first)[:100])
    assert decoder.next_frame() is None
    decoder.receive_data(frame(first)[100:])
    held = decoder.next_frame()
    assert held == first
    # the first frame's view is alive: the second frame must not overwrite its buffer
    assert _feed_buffered(decoder, frame(second), [70_000]) == [second]
    assert held == first
    assert pool.pooled_bytes == 2 * LARGE_FRAME * 2
    del held
    third = _payload(LARGE_FRAME * 2, 3)
    assert _feed_buffered(decoder, frame(third), [50_000]) == [third]
    assert pool.pooled_bytes == 2 * LARGE_FRAME * 2  # a free buffer came back: nothing new


def _feed_buffered_views(decoder: FrameDecoder, stream: bytes) -> list[Frame]:
    """Like _feed_buffered, keeping the frames themselves (views of their buffers) alive."""
    got: list[Frame] = []
    position = 0
    while position < len(stream):
        view = decoder.get_buffer()
        size = min(len(view), 10_000, len(stream) - position)
        view[:size] = stream[position : position + size]
        del view
        decoder.buffer_updated(size)
        position += size
        while (item := decoder.next_frame()) is not None:
            got.append(item)
    return got


def test_the_pool_is_bounded_and_frames_beyond_it_get_their_own_buffers() -> None:
    pool = BufferPool(max_buffers=1)
    decoder = FrameDecoder(pool=pool)
    payloads = [_payload(LARGE_FRAME + 1, seed) for seed in range(3)]
    views = []
    for payload in payloads:
        views += _feed_buffered_views(decoder, frame(payload))
    assert views == payloads  # every view still holds its own bytes
    assert pool.pooled_bytes == pooled_size(LARGE_FRAME + 1)


# ---- receive memory ----


def _start(decoder: FrameDecoder, data: bytes) -> Frame | None:
    view = decoder.get_buffer()
    view[: len(data)] = data
    del view
    decoder.buffer_updated(len(data))
    return decoder.next_frame()


def test_a_size_prefix_alone_commits_no_more_than_the_initial_buffer() -> None:
    decoder = FrameDecoder(pool=BufferPool())
    assert _start(decoder, struct.pack(">i", 50 * 1024 * 1024)) is None
    assert len(decoder.get_buffer()) == INITIAL_LARGE_BUFFER == 64 * 1024


def test_a_large_frame_reserves_its_size_and_gives_it_back_when_complete() -> None:
    from kvproxy.protocol.budget import MemoryBudget

    budget = MemoryBudget(1024 * 1024)
    decoder = FrameDecoder(budget=budget)
    payload = _payload(300_000, 3)
    stream = frame(payload)
    assert _start(decoder, stream[:1000]) is None
    assert budget.in_use == 300_000
    assert _feed_buffered(decoder, stream[1000:], [65536]) == [payload]
    assert budget.in_use == 0 and decoder.waiting is None


def test_a_frame_that_does_not_fit_the_budget_waits_with_its_bytes_kept() -> None:
    from kvproxy.protocol.budget import MemoryBudget

    budget = MemoryBudget(1024 * 1024)
    first, second = FrameDecoder(budget=budget), FrameDecoder(budget=budget)
    one, two = _payload(700_000, 1), _payload(600_000, 2)
    assert _start(first, frame(one)[:10]) is None
    assert _start(second, frame(two)[:5000]) is None
    assert second.waiting == 600_000  # 700,000 + 600,000 do not fit in 1 MiB
    assert budget.in_use == 700_000
    assert second.next_frame() is None and second.waiting == 600_000  # still no room
    assert _feed_buffered(first, frame(one)[10:], [65536]) == [one]
    assert budget.in_use == 0
    assert second.next_frame() is None  # room now: reserved and started
    assert second.waiting is None and budget.in_use == 600_000
    assert _feed_buffered(second, frame(two)[5000:], [65536]) == [two]
    assert budget.in_use == 0


def test_release_gives_back_a_partial_frames_reservation() -> None:
    from kvproxy.protocol.budget import MemoryBudget

    budget = MemoryBudget(1024 * 1024)
    decoder = FrameDecoder(budget=budget)
    assert _start(decoder, frame(_payload(500_000))[:100]) is None
    assert budget.in_use == 500_000
    decoder.release()
    decoder.release()  # twice is harmless
    assert budget.in_use == 0
