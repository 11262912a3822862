"""A decompressor that cannot allocate its memory is the proxy's failure, never corrupt data:
`OutOfMemory`, a retriable code (NOT_ENOUGH_REPLICAS), not CORRUPT_MESSAGE."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import cramjam
import pytest

from kvproxy.policies.api import PolicyContext, ProducedRecords, parse_records
from kvproxy.policies.chain import PolicyChain
from kvproxy.policies.plugins import find_factory
from kvproxy.protocol import error_codes
from kvproxy.protocol.budget import Allowance, BudgetExhausted, OutOfMemory
from kvproxy.protocol.compression import Codec, compress, decompress
from kvproxy.protocol.errors import CorruptRecords
from kvproxy.protocol.records import build_batch

REPO = Path(__file__).resolve().parents[2]
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def zstd_frame_with_window(window_log: int, content: bytes) -> bytes:
    """A valid zstd frame (one raw block, no content size) that declares a window of
    2**window_log bytes: a streaming decoder allocates that window before the first block."""
    descriptor = 0x00  # no content size, not single segment, no checksum, no dictionary
    window = (window_log - 10) << 3
    block_header = (len(content) << 3) | 0b001  # last block, raw
    return ZSTD_MAGIC + bytes([descriptor, window]) + struct.pack("<I", block_header)[:3] + content


def test_the_crafted_frame_decodes_when_memory_allows() -> None:
    frame = zstd_frame_with_window(27, b"hello")
    assert bytes(decompress(Codec.ZSTD, frame)) == b"hello"


def test_zstd_out_of_memory_under_a_real_memory_limit_is_out_of_memory_not_corrupt() -> None:
    """The decoder of a frame declaring a 128 MiB window, in a process whose address space
    has 48 MiB to spare, answers "Allocation error : not enough memory"."""
    script = textwrap.dedent(
        f"""
        import resource, re
        from kvproxy.protocol.compression import Codec, decompress
        from kvproxy.protocol.budget import OutOfMemory
        frame = {zstd_frame_with_window(27, b"hello")!r}
        status = open("/proc/self/status").read()
        size = int(re.search(r"VmSize:\\s+(\\d+) kB", status).group(1)) * 1024
        limit = size + 48 * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            decompress(Codec.ZSTD, frame)
        except OutOfMemory as exc:
            print("OutOfMemory", exc.error_code, exc)
        except Exception as exc:
            print(type(exc).__name__, exc)
        else:
            print("decoded")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done
    assert done.stdout.startswith(f"OutOfMemory {error_codes.NOT_ENOUGH_REPLICAS} "), done.stdout
    assert "Allocation error : not enough memory" in done.stdout


class FailingZstd:
    """cramjam.zstd whose decompressor fails to allocate, as cramjam reports it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def decompress_into(self, *_: Any) -> int:
        raise self.error

    def __getattr__(self, name: str) -> Any:
        return getattr(REAL_ZSTD, name)


REAL_ZSTD = cramjam.zstd


@pytest.mark.parametrize(
    "error",
    [
        cramjam.DecompressionError("Allocation error : not enough memory"),
        MemoryError(),
    ],
    ids=["zstd-allocation-error", "MemoryError"],
)
def test_an_allocation_failure_is_out_of_memory(
    monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    monkeypatch.setattr(cramjam, "zstd", FailingZstd(error))
    allowance = Allowance(1 << 20)
    with pytest.raises(OutOfMemory) as raised:
        decompress(Codec.ZSTD, compress(Codec.ZSTD, b"{}" * 100), allowance=allowance)
    assert raised.value.error_code == error_codes.NOT_ENOUGH_REPLICAS
    assert error_codes.lookup(raised.value.error_code).retriable
    assert isinstance(raised.value, BudgetExhausted), "answered where the budgets are"
    assert allowance.held == 0, "what the failed attempt took is given back"


def test_a_frame_no_decoder_allows_stays_corrupt() -> None:
    """A window past what zstd decoders accept (2 GiB here) is the data's fault, as for a
    broker."""
    with pytest.raises(CorruptRecords, match="too much memory"):
        decompress(Codec.ZSTD, zstd_frame_with_window(31, b"hello"))


def test_the_chain_raises_out_of_memory_to_its_caller_instead_of_a_corrupt_verdict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = build_batch([(b"k", b"{}", None, None)] * 10, codec=Codec.ZSTD)
    produced = parse_records(
        "t",
        0,
        batch,
        produce_version=9,
        acks=1,
        transactional_id=None,
        compacted=None,
        now_ms=0,
        allowance=Allowance(1 << 20),
    )
    assert isinstance(produced, ProducedRecords), produced
    policy = find_factory("json")(PolicyContext(base_dir=REPO))
    policy.configure({})
    chain = PolicyChain([policy])
    monkeypatch.setattr(
        cramjam,
        "zstd",
        FailingZstd(cramjam.DecompressionError("Allocation error : not enough memory")),
    )
    with pytest.raises(OutOfMemory):
        chain.check(produced)
