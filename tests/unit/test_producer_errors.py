"""kvproxy.producer.errors: one answer per error code, for ints and for the clients' exceptions
alike."""

from __future__ import annotations

import pickle

import aiokafka.errors
import kafka.errors
import pytest

from kvproxy.producer import errors as producer_errors
from kvproxy.producer.errors import (
    Classification,
    CommitFailedError,
    FailureType,
    IdempotenceUnavailableError,
    ProduceFailedError,
    classify,
    error_code,
    failure_type,
)
from kvproxy.protocol.error_codes import ERRORS, ERRORS_BY_NAME, ErrorProfile

FATAL_NAMES = (
    "CLUSTER_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "PRODUCER_FENCED",
    "INVALID_PRODUCER_EPOCH",
    "UNSUPPORTED_VERSION",
    "INVALID_TXN_STATE",
    "INVALID_TRANSACTION_TIMEOUT",
)
FATAL_CODES = frozenset(ERRORS_BY_NAME[name].code for name in FATAL_NAMES)

REJECTED_NAMES = (
    "INVALID_RECORD",
    "POLICY_VIOLATION",
    "INVALID_TIMESTAMP",
    "MESSAGE_TOO_LARGE",
    "RECORD_LIST_TOO_LARGE",
    "INVALID_TOPIC_EXCEPTION",
)

TRANSACTION_NAMES = (
    "INVALID_PRODUCER_EPOCH",
    "PRODUCER_FENCED",
    "INVALID_TXN_STATE",
    "INVALID_PRODUCER_ID_MAPPING",
    "INVALID_TRANSACTION_TIMEOUT",
    "CONCURRENT_TRANSACTIONS",
    "TRANSACTION_COORDINATOR_FENCED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_NOT_FOUND",
    "TRANSACTION_ABORTABLE",
    "DUPLICATE_SEQUENCE_NUMBER",
    "UNKNOWN_PRODUCER_ID",
)

ERROR_CODES = sorted(code for code in ERRORS if code != 0)
AIOKAFKA_CODES = sorted(code for code in aiokafka.errors.kafka_errors if code != 0)
KAFKA_PYTHON_CODES = sorted(
    code for code in kafka.errors.kafka_errors if isinstance(code, int) and code != 0
)


def _code(name: str) -> int:
    return ERRORS_BY_NAME[name].code


# --- every code in the table -------------------------------------------------------------------


@pytest.mark.parametrize("code", ERROR_CODES)
def test_classify_follows_the_table(code: int) -> None:
    answer = classify(code)
    assert isinstance(answer, Classification)
    if code in FATAL_CODES:
        expected = Classification.FATAL
    elif ERRORS[code].retriable:
        expected = Classification.RETRIABLE
    else:
        expected = Classification.ABORTABLE
    assert answer is expected, ERRORS[code].name


@pytest.mark.parametrize("code", ERROR_CODES)
@pytest.mark.parametrize("profile", list(ErrorProfile))
def test_failure_type_answers_every_code(code: int, profile: ErrorProfile) -> None:
    assert isinstance(failure_type(code, profile=profile), FailureType)


def test_no_fatal_code_is_retriable() -> None:
    assert not any(ERRORS[code].retriable for code in FATAL_CODES)


def test_the_fatal_codes_are_exactly_the_documented_ones() -> None:
    assert {code for code in ERRORS if code != 0 and classify(code) is Classification.FATAL} == (
        FATAL_CODES
    )


@pytest.mark.parametrize("code", [9999, -2])
def test_unknown_codes_are_abortable_delivery_failures(code: int) -> None:
    assert classify(code) is Classification.ABORTABLE
    assert failure_type(code) is FailureType.DELIVERY_FAILED


# --- the clients' exceptions agree with the ints ----------------------------------------------


@pytest.mark.parametrize("code", AIOKAFKA_CODES)
def test_aiokafka_errors_agree_with_their_codes(code: int) -> None:
    error = aiokafka.errors.for_code(code)()
    assert error_code(error) == code
    assert classify(error) is classify(code)
    for profile in ErrorProfile:
        assert failure_type(error, profile=profile) is failure_type(code, profile=profile)


@pytest.mark.parametrize("code", KAFKA_PYTHON_CODES)
def test_kafka_python_errors_agree_with_their_codes(code: int) -> None:
    error = kafka.errors.for_code(code)()
    assert error_code(error) == code
    assert classify(error) is classify(code)
    for profile in ErrorProfile:
        assert failure_type(error, profile=profile) is failure_type(code, profile=profile)


def test_aiokafka_does_not_know_invalid_record() -> None:
    # aiokafka reads 87 as UnknownError (-1): whoever reads Produce v8 must keep the real code.
    assert error_code(aiokafka.errors.for_code(87)()) == -1


def test_an_errno_on_another_exception_is_read() -> None:
    class Rejected(Exception):
        errno = 87

    assert error_code(Rejected()) == 87
    assert classify(Rejected()) is Classification.ABORTABLE
    assert failure_type(Rejected()) is FailureType.MESSAGE_REJECTED


def test_an_os_errno_is_not_a_kafka_code() -> None:
    error = ConnectionRefusedError(111, "Connection refused")
    assert error_code(error) is None
    assert classify(error) is Classification.ABORTABLE
    assert failure_type(error) is FailureType.DELIVERY_FAILED


# --- specific answers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "classification", "kind"),
    [
        (87, Classification.ABORTABLE, FailureType.MESSAGE_REJECTED),
        (90, Classification.FATAL, FailureType.TRANSACTION_FAILED),
        (47, Classification.FATAL, FailureType.TRANSACTION_FAILED),
        (7, Classification.RETRIABLE, FailureType.DELIVERY_FAILED),
        (19, Classification.RETRIABLE, FailureType.DELIVERY_FAILED),
        (2, Classification.RETRIABLE, FailureType.DELIVERY_FAILED),
        (31, Classification.FATAL, FailureType.DELIVERY_FAILED),
        (35, Classification.FATAL, FailureType.DELIVERY_FAILED),
        (76, Classification.ABORTABLE, FailureType.DELIVERY_FAILED),
        (43, Classification.ABORTABLE, FailureType.DELIVERY_FAILED),
        (120, Classification.ABORTABLE, FailureType.TRANSACTION_FAILED),
        (51, Classification.RETRIABLE, FailureType.TRANSACTION_FAILED),
    ],
)
def test_examples(code: int, classification: Classification, kind: FailureType) -> None:
    assert classify(code) is classification
    assert failure_type(code) is kind


@pytest.mark.parametrize("name", REJECTED_NAMES)
def test_record_refusals_are_message_rejected(name: str) -> None:
    for profile in ErrorProfile:
        assert failure_type(_code(name), profile=profile) is FailureType.MESSAGE_REJECTED
    assert classify(_code(name)) is Classification.ABORTABLE


@pytest.mark.parametrize("name", TRANSACTION_NAMES)
def test_producer_state_errors_are_transaction_failed(name: str) -> None:
    assert failure_type(_code(name)) is FailureType.TRANSACTION_FAILED


def test_45_and_85_depend_on_the_profile() -> None:
    assert failure_type(45, profile=ErrorProfile.KIP) is FailureType.MESSAGE_REJECTED
    assert failure_type(85, profile=ErrorProfile.KIP) is FailureType.MESSAGE_REJECTED
    assert failure_type(45) is not FailureType.MESSAGE_REJECTED
    assert failure_type(45, profile=ErrorProfile.KAFKA) is FailureType.TRANSACTION_FAILED
    assert failure_type(85, profile=ErrorProfile.KAFKA) is FailureType.DELIVERY_FAILED
    # What to do does not depend on the profile.
    assert classify(45) is Classification.ABORTABLE
    assert classify(85) is Classification.ABORTABLE


def test_no_error_is_not_an_error() -> None:
    with pytest.raises(ValueError, match="not an error"):
        classify(0)
    with pytest.raises(ValueError, match="not an error"):
        classify(aiokafka.errors.NoError())
    with pytest.raises(ValueError, match="not an error"):
        failure_type(0)


# --- errors without a code --------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        TimeoutError(),  # asyncio.TimeoutError is this builtin since Python 3.11
        aiokafka.errors.KafkaTimeoutError(),
        kafka.errors.KafkaTimeoutError(),
        aiokafka.errors.KafkaConnectionError("connection lost"),
        aiokafka.errors.NodeNotReadyError(),
        aiokafka.errors.NoBrokersAvailable(),
        kafka.errors.KafkaConnectionError(),
    ],
)
def test_timeouts_and_connection_errors_are_retriable(error: BaseException) -> None:
    assert error_code(error) is None
    assert classify(error) is Classification.RETRIABLE
    assert failure_type(error) is FailureType.DELIVERY_FAILED


def test_aiokafka_producer_fenced_has_no_code_and_is_fatal() -> None:
    error = aiokafka.errors.ProducerFenced()
    assert not hasattr(error, "errno")
    assert error_code(error) is None
    assert classify(error) is Classification.FATAL
    assert failure_type(error) is FailureType.TRANSACTION_FAILED


@pytest.mark.parametrize(
    "error",
    [
        aiokafka.errors.ProducerClosed(),
        aiokafka.errors.IncompatibleBrokerVersion(),
        aiokafka.errors.UnrecognizedBrokerVersion(),
        aiokafka.errors.IllegalStateError(),
        aiokafka.errors.IllegalOperation("Not in the middle of a transaction"),
        kafka.errors.IllegalStateError(),
        kafka.errors.IncompatibleBrokerVersion(),
        IdempotenceUnavailableError("the broker cannot give a producer id"),
    ],
)
def test_client_side_fatal_errors(error: BaseException) -> None:
    assert classify(error) is Classification.FATAL
    assert failure_type(error) is FailureType.DELIVERY_FAILED


def test_every_client_error_name_exists() -> None:
    names = producer_errors._FATAL_CLIENT_ERRORS | producer_errors._TIMEOUT_CLIENT_ERRORS
    for name in names:
        assert hasattr(aiokafka.errors, name) or hasattr(kafka.errors, name), name


@pytest.mark.parametrize(
    "error",
    [ValueError("x"), RuntimeError(), aiokafka.errors.KafkaError("boom"), AssertionError()],
)
def test_anything_else_is_abortable(error: BaseException) -> None:
    assert classify(error) is Classification.ABORTABLE
    assert failure_type(error) is FailureType.DELIVERY_FAILED


def test_error_code_of_ints_and_wrappers() -> None:
    assert error_code(87) == 87
    assert error_code(-1) == -1
    assert error_code(ValueError()) is None
    cause = aiokafka.errors.PolicyViolationError()
    produce_failed = ProduceFailedError(cause, FailureType.MESSAGE_REJECTED)
    assert error_code(produce_failed) == 44
    assert error_code(CommitFailedError(produce_failed)) == 44
    assert error_code(CommitFailedError(TimeoutError())) is None


# --- ProduceFailedError -----------------------------------------------------------------------


def test_produce_failed_error_carries_its_cause() -> None:
    cause = aiokafka.errors.InvalidTimestampError()
    message = "Timestamp 1 of message with offset 0 is out of range."
    error = ProduceFailedError(cause, FailureType.MESSAGE_REJECTED, message)
    assert error.cause is cause
    assert error.failure_type is FailureType.MESSAGE_REJECTED
    assert error.message == message
    assert error.code == 32
    assert error.error_name == "INVALID_TIMESTAMP"
    text = str(error)
    assert "message_rejected" in text
    assert "INVALID_TIMESTAMP" in text
    assert "32" in text
    assert message in text


def test_produce_failed_error_message_defaults_to_none() -> None:
    error = ProduceFailedError(aiokafka.errors.RequestTimedOutError(), FailureType.DELIVERY_FAILED)
    assert error.message is None
    assert str(error) == "delivery_failed: REQUEST_TIMED_OUT (error code 7)"


def test_produce_failed_error_without_a_code_names_the_exception() -> None:
    error = ProduceFailedError(
        aiokafka.errors.KafkaTimeoutError("batch expired"), FailureType.DELIVERY_FAILED
    )
    assert error.code is None
    assert error.error_name == "KafkaTimeoutError"
    assert str(error) == "delivery_failed: KafkaTimeoutError: batch expired"


def test_produce_failed_error_reads_a_refused_45_with_the_kip_names() -> None:
    class Refused(Exception):
        errno = 45

    refused = ProduceFailedError(Refused(), FailureType.MESSAGE_REJECTED, "record 2 has no key")
    assert refused.error_name == "INVALID_RECORD_KEY"
    assert str(refused) == (
        "message_rejected: INVALID_RECORD_KEY (error code 45): record 2 has no key"
    )
    gap = ProduceFailedError(
        aiokafka.errors.OutOfOrderSequenceNumber(), FailureType.TRANSACTION_FAILED
    )
    assert gap.error_name == "OUT_OF_ORDER_SEQUENCE_NUMBER"


@pytest.mark.parametrize(
    "cause",
    [
        aiokafka.errors.NotEnoughReplicasError(),
        aiokafka.errors.PolicyViolationError(),
        aiokafka.errors.ProducerFenced(),
        aiokafka.errors.InvalidProducerEpoch(),
        TimeoutError(),
        ValueError("x"),
    ],
)
def test_produce_failed_error_is_classified_by_its_cause(cause: BaseException) -> None:
    error = ProduceFailedError(cause, FailureType.DELIVERY_FAILED)
    assert classify(error) is classify(cause)
    # The failure type it was given is kept.
    assert failure_type(error) is FailureType.DELIVERY_FAILED


def test_produce_failed_error_pickles() -> None:
    error = ProduceFailedError(
        aiokafka.errors.PolicyViolationError(), FailureType.MESSAGE_REJECTED, "no"
    )
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.code, copy.failure_type, copy.message, str(copy)) == (
        error.code,
        error.failure_type,
        error.message,
        str(error),
    )


# --- CommitFailedError and IdempotenceUnavailableError ----------------------------------------


def test_commit_failed_error_carries_its_cause() -> None:
    cause = ProduceFailedError(
        aiokafka.errors.MessageSizeTooLargeError(),
        FailureType.MESSAGE_REJECTED,
        "The request included a message larger than the max message size",
    )
    error = CommitFailedError(cause)
    assert error.cause is cause
    assert error.code == 10
    text = str(error)
    assert "aborted" in text
    assert "MESSAGE_TOO_LARGE" in text
    assert "larger than the max message size" in text
    assert "begin a new transaction" in text
    assert classify(error) is Classification.ABORTABLE
    assert failure_type(error) is FailureType.TRANSACTION_FAILED


def test_commit_failed_error_with_a_plain_cause() -> None:
    error = CommitFailedError(aiokafka.errors.TopicAuthorizationFailedError("orders"))
    assert error.code == 29
    assert "TOPIC_AUTHORIZATION_FAILED (error code 29): orders" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error)


def test_idempotence_unavailable_error_says_why() -> None:
    error = IdempotenceUnavailableError("the broker answers InitProducerId only at v0")
    assert str(error) == "the broker answers InitProducerId only at v0"
    assert isinstance(error, Exception)


def test_failure_type_takes_the_profile_by_name() -> None:
    assert failure_type(45, profile="kip") is FailureType.MESSAGE_REJECTED
    assert failure_type(45, profile="kafka") is FailureType.TRANSACTION_FAILED
    with pytest.raises(ValueError, match="not a valid ErrorProfile"):
        failure_type(45, profile="strict")
