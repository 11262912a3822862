"""Kafka error codes: one table for everything the project emits or reads.

The names, numbers and retriable flags come from kio's `ErrorCode`, which is generated from
Kafka's own `Errors.java`; this module adds the two answer profiles (`errors.profile` in
docs/configuration.md). The `kafka` profile uses the released codes; the `kip` profile uses the
numbers of the KIP drafts the project grew from (KIP-135's INVALID_RECORD_KEY = 45, the KIP-467
draft's INVALID_RECORD = 85), which released clients read as OUT_OF_ORDER_SEQUENCE_NUMBER and
NO_REASSIGNMENT_IN_PROGRESS.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from kio.schema.errors import ErrorCode as _KioErrorCode


@dataclass(frozen=True, slots=True)
class KafkaError:
    """One row of the error table."""

    code: int
    name: str
    retriable: bool


def _build_table() -> MappingProxyType[int, KafkaError]:
    rows = {
        int(member.value): KafkaError(
            int(member.value), member.name.upper(), bool(member.retriable)
        )
        for member in _KioErrorCode
    }
    return MappingProxyType(rows)


ERRORS: Final[MappingProxyType[int, KafkaError]] = _build_table()
"""Every error code Kafka defines, keyed by code."""

ERRORS_BY_NAME: Final[MappingProxyType[str, KafkaError]] = MappingProxyType(
    {row.name: row for row in ERRORS.values()}
)

# Codes the project emits or branches on, named once so no module spells a bare number.
UNKNOWN_SERVER_ERROR: Final = -1
NONE: Final = 0
CORRUPT_MESSAGE: Final = 2
UNKNOWN_TOPIC_OR_PARTITION: Final = 3
REQUEST_TIMED_OUT: Final = 7
MESSAGE_TOO_LARGE: Final = 10
RECORD_LIST_TOO_LARGE: Final = 18
NOT_ENOUGH_REPLICAS: Final = 19
INVALID_REQUIRED_ACKS: Final = 21
INVALID_TIMESTAMP: Final = 32
UNSUPPORTED_VERSION: Final = 35
INVALID_REQUEST: Final = 42
UNSUPPORTED_FOR_MESSAGE_FORMAT: Final = 43
POLICY_VIOLATION: Final = 44
OUT_OF_ORDER_SEQUENCE_NUMBER: Final = 45
DUPLICATE_SEQUENCE_NUMBER: Final = 46
INVALID_PRODUCER_EPOCH: Final = 47
TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Final = 53
UNKNOWN_PRODUCER_ID: Final = 59
UNSUPPORTED_COMPRESSION_TYPE: Final = 76
NO_REASSIGNMENT_IN_PROGRESS: Final = 85
INVALID_RECORD: Final = 87
PRODUCER_FENCED: Final = 90
UNKNOWN_TOPIC_ID: Final = 100

# The KIP drafts' numbers (see the module docstring).
KIP_INVALID_RECORD_KEY: Final = 45
KIP_INVALID_RECORD: Final = 85


def lookup(code: int) -> KafkaError:
    """The table row for `code`; an unknown code gets a row named UNKNOWN_CODE_<n>."""
    row = ERRORS.get(code)
    if row is None:
        return KafkaError(code, f"UNKNOWN_CODE_{code}", False)
    return row


def error_name(code: int) -> str:
    return lookup(code).name


def is_retriable(code: int) -> bool:
    return lookup(code).retriable


class ErrorProfile(enum.Enum):
    """Which numbers the proxy uses when it answers a rejected record."""

    KAFKA = "kafka"
    KIP = "kip"


class Rejection(enum.Enum):
    """What kind of record rejection an answer reports; the profile turns it into a code."""

    MISSING_KEY = "missing_key"
    INVALID_RECORD = "invalid_record"


_PROFILE_CODES: Final[MappingProxyType[tuple[ErrorProfile, Rejection], int]] = MappingProxyType(
    {
        (ErrorProfile.KAFKA, Rejection.MISSING_KEY): INVALID_RECORD,
        (ErrorProfile.KAFKA, Rejection.INVALID_RECORD): INVALID_RECORD,
        (ErrorProfile.KIP, Rejection.MISSING_KEY): KIP_INVALID_RECORD_KEY,
        (ErrorProfile.KIP, Rejection.INVALID_RECORD): KIP_INVALID_RECORD,
    }
)


def rejection_code(profile: ErrorProfile, rejection: Rejection) -> int:
    """The error code a record rejection is answered with under `profile`."""
    return _PROFILE_CODES[(profile, rejection)]


def profile_error_name(profile: ErrorProfile, code: int) -> str:
    """How `code` reads under `profile` (45 is INVALID_RECORD_KEY only in the kip profile)."""
    if profile is ErrorProfile.KIP:
        if code == KIP_INVALID_RECORD_KEY:
            return "INVALID_RECORD_KEY"
        if code == KIP_INVALID_RECORD:
            return "INVALID_RECORD"
    return error_name(code)
