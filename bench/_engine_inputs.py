"""The inputs of the engine benchmark (bench/engine.py), built once: batches of keyed 100-byte
records of words and digits, 16 KiB and 1 MiB, uncompressed and in every codec, and the Produce
v9 frames carrying them."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bench._engine_calls import (
    produce_frame,
)
from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch
from kvproxy.protocol.records.layout import V2_HEADER_SIZE

KIB = 1024

MIB = 1024 * KIB

SIZES: dict[str, int] = {"16 KiB": 16 * KIB, "1 MiB": MIB}

CODECS: tuple[Codec, ...] = (Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD)

WORDS: tuple[str, ...] = (
    *("click", "view", "order", "cart", "pay", "refund", "login", "logout", "search", "share"),
    *("like", "follow", "open", "close", "alpha", "beta", "gamma", "delta", "north", "south"),
    *("east", "west", "red", "green", "blue", "amber"),
)


def make_records(count: int, seed: int = 7) -> list[tuple[bytes, bytes, None, None]]:
    """Keyed 100-byte records (10-byte key, 90-byte value of words and digits, compressible
    about as much as event payloads are); timestamps are now, so `timestamps` accepts them."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        text = " ".join(rng.choice(WORDS) + str(rng.randrange(10_000)) for _ in range(14))
        value = text.encode().ljust(90, b".")[:90]
        out.append((b"key-%06d" % i, value, None, None))
    return out


@dataclass(frozen=True)
class Inputs:
    """Every buffer the run measures, built once."""

    records_per: dict[str, int]
    """Records in each batch size."""
    plain: dict[str, bytes]
    """Uncompressed batch of each size."""
    compressed: dict[tuple[str, Codec], bytes]
    """The same records compressed, per size and codec."""
    frames: dict[str, bytes]
    """A Produce v9 frame carrying the plain batch of each size."""


def build_inputs(codec_sizes: Sequence[str]) -> Inputs:
    sample = build_batch(make_records(1000))
    per_record = (len(sample) - V2_HEADER_SIZE) / 1000
    records_per: dict[str, int] = {}
    plain: dict[str, bytes] = {}
    compressed: dict[tuple[str, Codec], bytes] = {}
    for label, target in SIZES.items():
        count = int((target - V2_HEADER_SIZE) / per_record)
        records = make_records(count)
        records_per[label] = count
        plain[label] = build_batch(records)
        for codec in CODECS if label in codec_sizes else ():
            compressed[label, codec] = build_batch(records, codec=codec)
    frames = {label: produce_frame(batch) for label, batch in plain.items()}
    return Inputs(records_per, plain, compressed, frames)
