"""The error table and the two answer profiles (`errors` in docs/configuration.md)."""

from __future__ import annotations

import pytest

from kvproxy.protocol import error_codes
from kvproxy.protocol.error_codes import (
    ERRORS,
    ERRORS_BY_NAME,
    ErrorProfile,
    Rejection,
    is_retriable,
    lookup,
    profile_error_name,
    rejection_code,
)
from kvproxy.protocol.errors import (
    BufferUnderflow,
    CorruptRecords,
    DecodeError,
    FrameTooLarge,
    ProtocolError,
    UnsupportedCompression,
    UnsupportedVersion,
)


@pytest.mark.parametrize(
    ("code", "name", "retriable"),
    [
        (-1, "UNKNOWN_SERVER_ERROR", False),
        (0, "NONE", False),
        (2, "CORRUPT_MESSAGE", True),
        (10, "MESSAGE_TOO_LARGE", False),
        (18, "RECORD_LIST_TOO_LARGE", False),
        (21, "INVALID_REQUIRED_ACKS", False),
        (32, "INVALID_TIMESTAMP", False),
        (42, "INVALID_REQUEST", False),
        (43, "UNSUPPORTED_FOR_MESSAGE_FORMAT", False),
        (44, "POLICY_VIOLATION", False),
        (45, "OUT_OF_ORDER_SEQUENCE_NUMBER", False),
        (46, "DUPLICATE_SEQUENCE_NUMBER", False),
        (47, "INVALID_PRODUCER_EPOCH", False),
        (59, "UNKNOWN_PRODUCER_ID", False),
        (76, "UNSUPPORTED_COMPRESSION_TYPE", False),
        (85, "NO_REASSIGNMENT_IN_PROGRESS", False),
        (87, "INVALID_RECORD", False),
        (90, "PRODUCER_FENCED", False),
    ],
)
def test_codes_the_proxy_uses_match_kafka(code: int, name: str, retriable: bool) -> None:
    row = lookup(code)
    assert (row.code, row.name, row.retriable) == (code, name, retriable)
    assert ERRORS_BY_NAME[name] is ERRORS[code]
    assert getattr(error_codes, name) == code


def test_retriable_flags_follow_kafka() -> None:
    assert is_retriable(error_codes.CORRUPT_MESSAGE)
    assert is_retriable(6)  # NOT_LEADER_OR_FOLLOWER
    assert is_retriable(7)  # REQUEST_TIMED_OUT
    assert not is_retriable(error_codes.INVALID_RECORD)


def test_table_is_complete_and_unknown_codes_are_named() -> None:
    assert set(range(-1, 120)) <= set(ERRORS)
    assert lookup(9999).name == "UNKNOWN_CODE_9999"
    assert not is_retriable(9999)


def test_kafka_profile_answers_with_released_codes() -> None:
    assert rejection_code(ErrorProfile.KAFKA, Rejection.MISSING_KEY) == 87
    assert rejection_code(ErrorProfile.KAFKA, Rejection.INVALID_RECORD) == 87
    assert profile_error_name(ErrorProfile.KAFKA, 45) == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert profile_error_name(ErrorProfile.KAFKA, 85) == "NO_REASSIGNMENT_IN_PROGRESS"


def test_kip_profile_answers_with_the_drafts_codes() -> None:
    assert rejection_code(ErrorProfile.KIP, Rejection.MISSING_KEY) == 45
    assert rejection_code(ErrorProfile.KIP, Rejection.INVALID_RECORD) == 85
    assert profile_error_name(ErrorProfile.KIP, 45) == "INVALID_RECORD_KEY"
    assert profile_error_name(ErrorProfile.KIP, 85) == "INVALID_RECORD"
    assert profile_error_name(ErrorProfile.KIP, 87) == "INVALID_RECORD"
    assert ErrorProfile("kip") is ErrorProfile.KIP


def test_each_exception_carries_the_code_it_maps_to() -> None:
    assert issubclass(DecodeError, ProtocolError)
    assert issubclass(BufferUnderflow, DecodeError)
    assert issubclass(FrameTooLarge, DecodeError)
    assert issubclass(UnsupportedCompression, CorruptRecords)
    assert DecodeError.error_code == error_codes.INVALID_REQUEST
    assert CorruptRecords.error_code == error_codes.CORRUPT_MESSAGE
    assert UnsupportedCompression.error_code == error_codes.UNSUPPORTED_COMPRESSION_TYPE
    assert UnsupportedVersion(0, 99).error_code == error_codes.UNSUPPORTED_VERSION
