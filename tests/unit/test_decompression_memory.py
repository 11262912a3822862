"""What decompressing holds, counted: the memory a frame declares is charged before it is
decoded, and a large output is never allocated on the interpreter's heap (which zero-fills it
while holding the GIL, stalling the event loop beside the decoding thread)."""

from __future__ import annotations

import tracemalloc
from typing import Any

import cramjam
import lz4.frame  # type: ignore[import-untyped]
import pytest

from kvproxy.protocol.budget import Allowance, BudgetExhausted, MemoryBudget
from kvproxy.protocol.compression import Codec, _lz4_set_header_checksum, compress, decompress
from tests.harness.zstd_frames import zstd_window_frame

MiB = 1024 * 1024
MESSAGE_TOO_LARGE = 10


@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.GZIP, Codec.LZ4, Codec.SNAPPY])
def test_a_large_output_is_not_allocated_on_the_interpreters_heap(codec: Codec) -> None:
    plain = bytes(16 * MiB)
    payload = compress(codec, plain)
    allowance = Allowance(64 * MiB, MemoryBudget(128 * MiB))
    tracemalloc.start()
    try:
        out = decompress(codec, payload, allowance=allowance, headroom=61)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(out) == 61 + len(plain) and bytes(out[61:]) == plain
    assert peak < MiB, f"{peak} bytes allocated on the interpreter's heap"
    assert allowance.held == len(plain) + 61  # what the output holds, counted until released


def test_a_gzip_payload_is_decoded_once_into_the_size_its_trailer_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = bytes(16 * MiB)
    payload = compress(Codec.GZIP, plain)
    calls: list[int] = []
    real = cramjam.gzip.decompress_into

    def counted(data: Any, output: Any) -> int:
        calls.append(len(output))
        return int(real(data, output))

    monkeypatch.setattr(cramjam.gzip, "decompress_into", counted)
    assert bytes(decompress(Codec.GZIP, payload)) == plain
    assert calls == [16 * MiB]


def test_a_zstd_window_past_the_allowance_is_refused_before_decoding() -> None:
    frame = zstd_window_frame(27, b"x" * 100)  # 128 MiB window, 100 bytes of content
    allowance = Allowance(64 * MiB, MemoryBudget(512 * MiB))
    with pytest.raises(BudgetExhausted) as refused:
        decompress(Codec.ZSTD, frame, allowance=allowance)
    assert refused.value.error_code == MESSAGE_TOO_LARGE
    assert "limits.decode_bytes_per_request" in str(refused.value)
    assert allowance.held == 0 and allowance.peak == 0  # refused before anything was taken


def test_a_zstd_window_within_the_allowance_is_counted_while_decoding() -> None:
    frame = zstd_window_frame(27, b"x" * 100)
    allowance = Allowance(256 * MiB, MemoryBudget(512 * MiB))
    assert bytes(decompress(Codec.ZSTD, frame, allowance=allowance)) == b"x" * 100
    assert allowance.peak >= 128 * MiB  # the window, counted while the frame was decoded
    assert allowance.held == 100  # only the output stays


def test_a_zstd_content_size_past_the_allowance_is_refused_before_decoding() -> None:
    payload = bytes(cramjam.zstd.compress(bytes(80 * MiB)))  # declares its 80 MiB
    allowance = Allowance(64 * MiB, MemoryBudget(512 * MiB))
    with pytest.raises(BudgetExhausted):
        decompress(Codec.ZSTD, payload, allowance=allowance)
    assert allowance.peak == 0


def test_an_lz4_block_size_past_the_allowance_is_refused_before_decoding() -> None:
    """A 100-byte frame whose descriptor declares 4 MiB blocks: the decoder allocates its block
    buffers from that, whatever the frame holds."""
    frame = bytearray(lz4.frame.compress(b"x" * 100, store_size=False))
    frame[5] = 0x70  # block maximum size id 7: 4 MiB
    payload = _lz4_set_header_checksum(bytes(frame), legacy=False)
    assert bytes(decompress(Codec.LZ4, payload)) == b"x" * 100  # a valid frame
    allowance = Allowance(4 * MiB, MemoryBudget(512 * MiB))
    with pytest.raises(BudgetExhausted):
        decompress(Codec.LZ4, payload, allowance=allowance)
    assert allowance.peak == 0


def test_a_gzip_trailer_past_the_allowance_is_refused_without_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the event loop (an inline allowance) a gzip bomb is not even partly decoded: its
    trailer says it holds more than the loop may decode, so it moves off the loop at once."""
    from kvproxy.protocol.budget import InlineLimitReached

    payload = compress(Codec.GZIP, bytes(16 * MiB))
    calls: list[int] = []
    monkeypatch.setattr(cramjam.gzip, "decompress_into", lambda *_: calls.append(1))
    with pytest.raises(InlineLimitReached):
        decompress(Codec.GZIP, payload, allowance=Allowance(4 * MiB, inline=True))
    assert calls == []
