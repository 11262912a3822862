"""Random and mutated inputs: the readers raise DecodeError subclasses, never library errors."""

from __future__ import annotations

import contextlib
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvproxy.protocol.compression import Codec
from kvproxy.protocol.errors import DecodeError
from kvproxy.protocol.records import build_batch, iter_batches, read_batch
from tests.harness.records_testdata import MAGIC_CODECS, segment_bytes


def _valid_samples() -> list[bytes]:
    samples = [
        batch.buffer.tobytes() for batch in list(iter_batches(segment_bytes("cities-0")))[:2]
    ]
    samples += [
        batch.buffer.tobytes()
        for batch in list(iter_batches(segment_bytes("__consumer_offsets-0")))
    ]
    for magic, codec in MAGIC_CODECS:
        records = [
            (b"key", b"value-" * 4, [("h", b"v"), ("n", None)] if magic == 2 else None, 1234),
            (None, b"", None, 1235),
            (b"", None, None, 1236),
        ]
        samples.append(build_batch(records, magic=magic, codec=codec))  # type: ignore[arg-type]
    return samples


VALID = _valid_samples()


def exercise(data: bytes) -> None:
    """Everything a caller may do with untrusted bytes; only DecodeError may come out."""
    with contextlib.suppress(DecodeError):
        read_batch(data)
    try:
        for batch in iter_batches(data, allow_partial_tail=True):
            batch.crc_valid()
            _ = (batch.codec, batch.timestamp_type, batch.is_control, batch.is_transactional)
            with contextlib.suppress(DecodeError):
                batch.inner_crcs_valid()
            try:
                for record in batch.records():
                    _ = (record.key, record.value, record.headers, record.has_key)
                _ = batch.record_count
            except DecodeError:
                pass
    except DecodeError:
        pass


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        kind = draw(
            st.sampled_from(
                ["flip", "set", "truncate", "insert", "delete", "length", "magic", "codec", "int32"]
            )
        )
        position = draw(st.integers(min_value=0, max_value=max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[position] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif kind == "set" and data:
            data[position] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
        elif kind == "truncate":
            del data[position:]
        elif kind == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[position : position + draw(st.integers(min_value=1, max_value=8))]
        elif kind == "length" and len(data) >= 12:
            struct.pack_into(
                ">i", data, 8, draw(st.integers(min_value=-(2**31), max_value=2**31 - 1))
            )
        elif kind == "magic" and len(data) > 16:
            data[16] = draw(st.integers(min_value=0, max_value=255))
        elif kind == "codec" and len(data) > 22:
            attributes_pos = 22 if data[16] == 2 else 17
            data[attributes_pos] = (data[attributes_pos] & ~7) | draw(
                st.sampled_from(list(range(8)))
            )
        elif kind == "int32" and len(data) >= 4:
            # record counts, key/value lengths and varints live here: make them huge or negative
            at = draw(st.integers(min_value=0, max_value=len(data) - 4))
            struct.pack_into(
                ">i", data, at, draw(st.sampled_from([-2, -1, 0, 1, 2**31 - 1, -(2**31), 255]))
            )
    return bytes(data)


inputs = st.one_of(
    mutated(),
    mutated().map(lambda d: d + d),  # a second batch after a damaged one
    st.binary(max_size=200),
    st.binary(min_size=12, max_size=120).map(
        lambda d: d[:8] + struct.pack(">i", len(d) - 12) + d[12:]
    ),
)


@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(inputs)
def test_decoders_raise_only_decode_errors(data: bytes) -> None:
    exercise(data)


def test_every_codec_id_on_every_magic_is_handled() -> None:
    for sample in VALID:
        for codec_id in range(8):
            data = bytearray(sample)
            attributes_pos = 22 if data[16] == 2 else 17
            data[attributes_pos] = (data[attributes_pos] & ~7) | codec_id
            exercise(bytes(data))
    assert {Codec(c) for c in range(5)} == set(Codec)
