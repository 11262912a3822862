"""The protocol layer's exceptions: one hierarchy, each class carrying the Kafka code it maps to.

A `DecodeError` means the peer sent bytes that are not a valid Kafka message; the proxy ends the
connection. Policy rejections are never exceptions (they are values in `policies`).
"""

from __future__ import annotations

from typing import ClassVar

from kvproxy.protocol import error_codes


class ProtocolError(Exception):
    """Base of every error raised by `protocol`."""

    error_code: ClassVar[int] = error_codes.UNKNOWN_SERVER_ERROR


class DecodeError(ProtocolError):
    """Bytes that do not decode as the message they claim to be."""

    error_code: ClassVar[int] = error_codes.INVALID_REQUEST


class BufferUnderflow(DecodeError):
    """The input ended before the value being read did."""


class FrameTooLarge(DecodeError):
    """A size prefix larger than the configured maximum frame size."""


class NegativeSize(DecodeError):
    """A size prefix or length field below zero where none is allowed."""


class CorruptRecords(DecodeError):
    """A record batch or message set that cannot be parsed (bad length, varint or magic)."""

    error_code: ClassVar[int] = error_codes.CORRUPT_MESSAGE


class BatchFraming(CorruptRecords):
    """A batch whose size or magic is nonsense, with the words Kafka's batch iterator
    (`ByteBufferLogInputStream.nextBatchSize`) answers it with in `kafka_message`."""

    def __init__(self, message: str, kafka_message: str) -> None:
        super().__init__(message)
        self.kafka_message = kafka_message


class InvalidRecords(CorruptRecords):
    """A batch whose CRC holds but whose records do not match its header or do not parse: the
    producer wrote them so, and a retry sends the same bytes. Kafka answers INVALID_RECORD with
    the reason its record iterators give (`DefaultRecordBatch`, `DefaultRecord`)."""

    error_code: ClassVar[int] = error_codes.INVALID_RECORD


class UnsupportedCompression(CorruptRecords):
    """A compression codec id Kafka does not define."""

    error_code: ClassVar[int] = error_codes.UNSUPPORTED_COMPRESSION_TYPE


class UnsupportedVersion(ProtocolError):
    """An (api key, version) pair the codec table does not hold: reported, never guessed."""

    error_code: ClassVar[int] = error_codes.UNSUPPORTED_VERSION

    def __init__(self, api_key: int, api_version: int) -> None:
        super().__init__(f"no codec for api key {api_key} version {api_version}")
        self.api_key = api_key
        self.api_version = api_version


class EncodeError(ProtocolError):
    """A value that cannot be written (out of range, wrong shape)."""


class TooManyNodes(DecodeError):
    """A broker's answer naming more brokers or endpoints than any cluster has
    (`kvproxy.protocol.admin.MAX_NODES_PER_ANSWER`): refused whole, never rewritten or learnt."""
