"""Checks on the request rather than the records: compression codecs and required acks."""

from __future__ import annotations

from kvproxy.policies.accept_form import ANY_PARTITION, AcceptForm
from kvproxy.policies.api import ACCEPT, ProducedRecords, TopicConfig, Verdict
from kvproxy.policies.builtin.base import BuiltinPolicy
from kvproxy.policies.errors import short_repr
from kvproxy.protocol import error_codes
from kvproxy.protocol.compression import Codec

__all__ = ["AcksPolicy", "CompressionPolicy"]

_CODEC_NAMES = {codec.name.lower(): codec for codec in Codec}


class CompressionPolicy(BuiltinPolicy):
    """Only the listed codecs (`none`, `gzip`, `snappy`, `lz4`, `zstd`)."""

    name = "compression"
    OPTIONS = {"allowed": ["none", "gzip", "snappy", "lz4", "zstd"]}

    def setup(self) -> None:
        allowed: set[Codec] = set()
        for item in self._list_option("allowed"):
            codec = _CODEC_NAMES.get(item.lower()) if isinstance(item, str) else None
            if codec is None:
                known = ", ".join(_CODEC_NAMES)
                raise self._error(f"unknown codec {short_repr(item)} in allowed (known: {known})")
            allowed.add(codec)
        self.allowed = frozenset(allowed)
        self._allowed_text = ", ".join(c.name.lower() for c in sorted(allowed))

    def accept_form(self, config: TopicConfig) -> AcceptForm | None:
        """The fast accept takes uncompressed batches only: they pass when `none` is allowed."""
        return ANY_PARTITION if Codec.NONE in self.allowed else None

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        for b in batch.batches:
            if b.codec not in self.allowed:
                return Verdict(
                    error_codes.UNSUPPORTED_COMPRESSION_TYPE,
                    f"Compression type {b.codec.name.lower()} is not allowed in topic partition "
                    f"{batch.topic_partition} (allowed: {self._allowed_text})",
                )
        return ACCEPT


class AcksPolicy(BuiltinPolicy):
    """Only the listed `acks` values (e.g. `[-1]` to require acks=all)."""

    name = "acks"
    OPTIONS = {"allowed": [-1, 0, 1]}

    def setup(self) -> None:
        values = self._list_option("allowed")
        for value in values:
            if value not in (-1, 0, 1) or isinstance(value, bool):
                raise self._error(f"acks values are -1, 0 and 1, not {short_repr(value)}")
        if not values:
            raise self._error("allowed must name at least one acks value")
        self.allowed = frozenset(int(v) for v in values)

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        if batch.acks in self.allowed:
            return ACCEPT
        allowed = ", ".join(str(v) for v in sorted(self.allowed))
        return Verdict(
            error_codes.INVALID_REQUIRED_ACKS,
            f"acks={batch.acks} is not allowed for topic {batch.topic} (allowed: {allowed})",
        )
