"""What a failed send means, and what to do about it.

Every error a producer meets is answered twice here:

* `classify` says what the producer does next: retry (RETRIABLE), give up on this send or abort
  the transaction and carry on (ABORTABLE), or close the producer (FATAL);
* `failure_type` says what went wrong for the record: the broker (or the validating proxy)
  refused it (MESSAGE_REJECTED), it could not be delivered (DELIVERY_FAILED), or the producer's
  idempotence / transaction state failed (TRANSACTION_FAILED).

Both read the project's error table (`kvproxy.protocol.error_codes`), so a code means the same
thing here as in the proxy. They accept a bare error code, an aiokafka or kafka-python error, and
the exceptions below.

>>> import aiokafka.errors
>>> classify(87), failure_type(87)
(<Classification.ABORTABLE: 'abortable'>, <FailureType.MESSAGE_REJECTED: 'message_rejected'>)
>>> classify(aiokafka.errors.NotEnoughReplicasError())
<Classification.RETRIABLE: 'retriable'>
>>> classify(aiokafka.errors.ProducerFenced())
<Classification.FATAL: 'fatal'>
"""

from __future__ import annotations

import enum
from typing import Final

from kvproxy.protocol.error_codes import (
    ERRORS_BY_NAME,
    KIP_INVALID_RECORD,
    KIP_INVALID_RECORD_KEY,
    NONE,
    ErrorProfile,
    error_name,
    is_retriable,
    profile_error_name,
)

__all__ = [
    "Classification",
    "CommitFailedError",
    "FailureType",
    "IdempotenceUnavailableError",
    "ProduceFailedError",
    "classify",
    "error_code",
    "failure_type",
]


class FailureType(enum.Enum):
    """What went wrong for a record whose send failed.

    MESSAGE_REJECTED
        Something about this record was refused: its content (INVALID_RECORD, POLICY_VIOLATION;
        the kip profile's INVALID_RECORD_KEY and INVALID_RECORD), its timestamp
        (INVALID_TIMESTAMP), its size (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE) or its topic
        (INVALID_TOPIC_EXCEPTION). Sending it again unchanged fails the same way; other records
        are not affected.
    DELIVERY_FAILED
        The record could not be delivered: timeouts, not enough replicas, retries exhausted,
        authorization, an unsupported compression codec or message format (a producer setting,
        so every record fails alike: not this record's fault), and anything else.
    TRANSACTION_FAILED
        The producer's id, epoch, sequence numbers or transaction failed: fenced, invalid
        transaction state, abortable transaction errors, sequence errors.
    """

    MESSAGE_REJECTED = "message_rejected"
    DELIVERY_FAILED = "delivery_failed"
    TRANSACTION_FAILED = "transaction_failed"


class Classification(enum.Enum):
    """What to do after an error.

    RETRIABLE
        Transient: the same request may succeed later.
    ABORTABLE
        This send failed. A transactional producer aborts the transaction and may retry it; a
        plain producer reports the failure and goes on.
    FATAL
        The producer cannot go on and must be closed.
    """

    RETRIABLE = "retriable"
    ABORTABLE = "abortable"
    FATAL = "fatal"


def _code(name: str) -> int:
    # A KeyError here at import means the error table lost a name this module relies on.
    return ERRORS_BY_NAME[name].code


_FATAL_CODES: Final[frozenset[int]] = frozenset(
    _code(name)
    for name in (
        # Kafka's TransactionManager.maybeTransitionToErrorState: the four fatal exceptions.
        "CLUSTER_AUTHORIZATION_FAILED",
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        "PRODUCER_FENCED",
        "UNSUPPORTED_VERSION",
        # The coordinator handlers turn it into ProducerFencedException; aiokafka raises
        # ProducerFenced for it on every path, produce responses included.
        "INVALID_PRODUCER_EPOCH",
        # The AddPartitionsToTxn and EndTxn handlers call fatalError on it (only a failed
        # produce batch with it is abortable in Java; aiokafka raises it out of its sender).
        "INVALID_TXN_STATE",
        # Only InitProducerId returns it, and that handler fails fatally on it: the configured
        # transaction timeout is over the broker's maximum, so the producer can never start.
        "INVALID_TRANSACTION_TIMEOUT",
    )
)

_REJECTED_CODES: Final[frozenset[int]] = frozenset(
    _code(name)
    for name in (
        "INVALID_RECORD",
        "POLICY_VIOLATION",
        "INVALID_TIMESTAMP",
        "MESSAGE_TOO_LARGE",
        "RECORD_LIST_TOO_LARGE",
        "INVALID_TOPIC_EXCEPTION",
    )
)

_KIP_REJECTED_CODES: Final[frozenset[int]] = frozenset({KIP_INVALID_RECORD_KEY, KIP_INVALID_RECORD})

_TRANSACTION_CODES: Final[frozenset[int]] = frozenset(
    _code(name)
    for name in (
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
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
        "DUPLICATE_SEQUENCE_NUMBER",
        "UNKNOWN_PRODUCER_ID",
    )
)

# Client-side errors (no error code) are recognised by class name in aiokafka's and
# kafka-python's error modules, so neither library has to be imported here (the tests check
# that every name below exists in aiokafka.errors or kafka.errors).
_CLIENT_ERROR_MODULES: Final = frozenset({"aiokafka.errors", "kafka.errors"})
_FATAL_CLIENT_ERRORS: Final = frozenset(
    {
        "ProducerFenced",
        "ProducerClosed",
        "IncompatibleBrokerVersion",
        "UnrecognizedBrokerVersion",
        "IllegalStateError",
        "IllegalOperation",
    }
)
_TIMEOUT_CLIENT_ERRORS: Final = frozenset({"KafkaTimeoutError"})


def _client_error_names(error: BaseException) -> frozenset[str]:
    return frozenset(
        cls.__name__ for cls in type(error).__mro__ if cls.__module__ in _CLIENT_ERROR_MODULES
    )


def _args_text(error: BaseException) -> str | None:
    if not error.args:
        return None
    return ", ".join(str(arg) for arg in error.args)


def _describe(error: BaseException) -> str:
    """`NAME (error code N): detail` for a coded error, `ClassName: detail` otherwise."""
    if isinstance(error, ProduceFailedError | CommitFailedError):
        return str(error)
    code = error_code(error)
    head = type(error).__name__ if code is None else f"{error_name(code)} (error code {code})"
    detail = _args_text(error)
    return head if detail is None else f"{head}: {detail}"


class ProduceFailedError(Exception):
    """A record's send failed; `failure_type` says how, `cause` is the underlying error.

    Attributes: `cause`, `failure_type`, `message` (the broker's or the proxy's per-record or
    batch message when known, else None), `code` (the Kafka error code of the cause, or None)
    and `error_name` (the code's name, read with the kip profile when the failure type says
    the record was refused with 45 or 85; the cause's class name when there is no code).

    >>> import aiokafka.errors
    >>> error = ProduceFailedError(
    ...     aiokafka.errors.PolicyViolationError(),
    ...     FailureType.MESSAGE_REJECTED,
    ...     "record 0: field 'id' is required",
    ... )
    >>> error.code
    44
    >>> print(error)
    message_rejected: POLICY_VIOLATION (error code 44): record 0: field 'id' is required
    >>> print(ProduceFailedError(TimeoutError(), FailureType.DELIVERY_FAILED))
    delivery_failed: TimeoutError
    """

    def __init__(
        self, cause: BaseException, failure_type: FailureType, message: str | None = None
    ) -> None:
        super().__init__(cause, failure_type, message)
        self.cause = cause
        self.failure_type = failure_type
        self.message = message
        self.code = error_code(cause)
        if self.code is None:
            self.error_name = type(cause).__name__
        else:
            refused_under_kip = (
                failure_type is FailureType.MESSAGE_REJECTED and self.code in _KIP_REJECTED_CODES
            )
            profile = ErrorProfile.KIP if refused_under_kip else ErrorProfile.KAFKA
            self.error_name = profile_error_name(profile, self.code)

    def __str__(self) -> str:
        text = f"{self.failure_type.value}: {self.error_name}"
        if self.code is not None:
            text += f" (error code {self.code})"
        detail = self.message if self.message is not None else _args_text(self.cause)
        return text if detail is None else f"{text}: {detail}"


class CommitFailedError(Exception):
    """A transaction could not commit because of an abortable error; it was aborted.

    `cause` is that error, `code` its Kafka error code (or None). Begin a new transaction and
    try again. (Not aiokafka's consumer-side `CommitFailedError`.)

    >>> import aiokafka.errors
    >>> error = CommitFailedError(aiokafka.errors.MessageSizeTooLargeError())
    >>> error.code
    10
    >>> print(error)
    commit failed and the transaction was aborted: MESSAGE_TOO_LARGE (error code 10); begin a new \
transaction and try again
    """

    def __init__(self, cause: BaseException) -> None:
        super().__init__(cause)
        self.cause = cause
        self.code = error_code(cause)

    def __str__(self) -> str:
        return (
            f"commit failed and the transaction was aborted: {_describe(self.cause)}; "
            "begin a new transaction and try again"
        )


class IdempotenceUnavailableError(Exception):
    """idempotence="required", but the broker or the topic cannot do it; the message says why.

    >>> str(IdempotenceUnavailableError("the broker does not support InitProducerId v3+"))
    'the broker does not support InitProducerId v3+'
    """


def error_code(error: BaseException | int) -> int | None:
    """The Kafka error code of `error`, or None when it has none.

    An int is its own code. An aiokafka or kafka-python broker error gives its `errno` (any
    other exception carrying an int `errno` is read the same way, except OSError, whose errno is
    an operating-system code). ProduceFailedError and CommitFailedError give their cause's code.

    >>> import aiokafka.errors
    >>> error_code(87), error_code(aiokafka.errors.NotEnoughReplicasError())
    (87, 19)
    >>> error_code(aiokafka.errors.KafkaTimeoutError()) is None
    True
    >>> error_code(ConnectionRefusedError(111, "refused")) is None
    True
    """
    if isinstance(error, int):
        return error
    if isinstance(error, ProduceFailedError | CommitFailedError):
        return error.code
    if isinstance(error, OSError):
        return None
    errno = getattr(error, "errno", None)
    if isinstance(errno, int) and not isinstance(errno, bool):
        return errno
    return None


def _classify_code(code: int) -> Classification:
    if code == NONE:
        raise ValueError("error code 0 (NONE) is not an error")
    if code in _FATAL_CODES:
        return Classification.FATAL
    if is_retriable(code):
        return Classification.RETRIABLE
    return Classification.ABORTABLE


def classify(error: BaseException | int) -> Classification:
    """What to do after `error`, from the project's error table.

    FATAL (close the producer): CLUSTER_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    PRODUCER_FENCED and UNSUPPORTED_VERSION (the fatal exceptions of Kafka's
    TransactionManager.maybeTransitionToErrorState); INVALID_PRODUCER_EPOCH (the coordinator
    handlers treat it as PRODUCER_FENCED and aiokafka raises ProducerFenced for it);
    INVALID_TXN_STATE (the AddPartitionsToTxn and EndTxn handlers fail fatally on it; Java aborts
    when a produce batch gets it, but a code alone does not say where it came from, and aborting a
    producer whose coordinator state is gone is the worse mistake); INVALID_TRANSACTION_TIMEOUT
    (only InitProducerId returns it, and its handler fails fatally).

    RETRIABLE: every other code the table marks retriable. ABORTABLE: every other code. The
    answer does not depend on the error profile: 45 and 85 are ABORTABLE in both.

    Errors without a code: TimeoutError (asyncio.TimeoutError is the builtin since Python 3.11)
    and aiokafka's / kafka-python's
    KafkaTimeoutError are RETRIABLE, and so is any other of their errors marked `retriable`
    (KafkaConnectionError, NodeNotReadyError, NoBrokersAvailable, ...). FATAL: aiokafka's
    ProducerFenced (it has no errno), ProducerClosed, IncompatibleBrokerVersion and
    UnrecognizedBrokerVersion (the client-side UNSUPPORTED_VERSION), IllegalStateError and
    IllegalOperation (the producer refused the call in its current state: neither a retry nor an
    abort is known to be safe), and IdempotenceUnavailableError. ProduceFailedError and
    CommitFailedError are classified by their cause. Anything else is ABORTABLE.

    >>> classify(7), classify(87), classify(90)
    (<Classification.RETRIABLE: 'retriable'>, <Classification.ABORTABLE: 'abortable'>, \
<Classification.FATAL: 'fatal'>)
    >>> classify(0)
    Traceback (most recent call last):
    ...
    ValueError: error code 0 (NONE) is not an error
    """
    if isinstance(error, ProduceFailedError | CommitFailedError):
        return classify(error.cause)
    code = error_code(error)
    if code is not None:
        return _classify_code(code)
    assert not isinstance(error, int)  # an int is its own code
    if isinstance(error, IdempotenceUnavailableError):
        return Classification.FATAL
    names = _client_error_names(error)
    if names & _FATAL_CLIENT_ERRORS:
        return Classification.FATAL
    if isinstance(error, TimeoutError) or names & _TIMEOUT_CLIENT_ERRORS:
        return Classification.RETRIABLE
    if "KafkaError" in names and getattr(error, "retriable", False) is True:
        return Classification.RETRIABLE
    return Classification.ABORTABLE


def _failure_type_of_code(code: int, profile: ErrorProfile) -> FailureType:
    if code == NONE:
        raise ValueError("error code 0 (NONE) is not an error")
    if profile is ErrorProfile.KIP and code in _KIP_REJECTED_CODES:
        return FailureType.MESSAGE_REJECTED
    if code in _REJECTED_CODES:
        return FailureType.MESSAGE_REJECTED
    if code in _TRANSACTION_CODES:
        return FailureType.TRANSACTION_FAILED
    return FailureType.DELIVERY_FAILED


def failure_type(
    error: BaseException | int, *, profile: ErrorProfile | str = ErrorProfile.KAFKA
) -> FailureType:
    """Which FailureType a record's failure is.

    MESSAGE_REJECTED: INVALID_RECORD (87), POLICY_VIOLATION (44), INVALID_TIMESTAMP (32),
    MESSAGE_TOO_LARGE (10), RECORD_LIST_TOO_LARGE (18), INVALID_TOPIC_EXCEPTION (17) and, under
    the kip profile, INVALID_RECORD_KEY (45) and INVALID_RECORD (85).
    UNSUPPORTED_COMPRESSION_TYPE (76) and UNSUPPORTED_FOR_MESSAGE_FORMAT (43) are DELIVERY_FAILED:
    they refuse the producer's codec or message format, not the record.

    TRANSACTION_FAILED: the producer-id, epoch, sequence and transaction errors
    (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED, INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING,
    INVALID_TRANSACTION_TIMEOUT, CONCURRENT_TRANSACTIONS, TRANSACTION_COORDINATOR_FENCED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_NOT_FOUND, TRANSACTION_ABORTABLE,
    DUPLICATE_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID) and, under the kafka profile,
    OUT_OF_ORDER_SEQUENCE_NUMBER (45): a sequence gap breaks the producer's idempotence state,
    not the record (Java aborts the transaction or, for an idempotent producer, bumps the
    epoch; older Java producers closed). aiokafka's ProducerFenced and CommitFailedError are
    TRANSACTION_FAILED too.

    DELIVERY_FAILED: every other code (NO_REASSIGNMENT_IN_PROGRESS, 85, under the kafka
    profile), timeouts and every other exception. A ProduceFailedError keeps its own type.

    >>> failure_type(45, profile=ErrorProfile.KIP), failure_type(45)
    (<FailureType.MESSAGE_REJECTED: 'message_rejected'>, \
<FailureType.TRANSACTION_FAILED: 'transaction_failed'>)
    >>> failure_type(19)
    <FailureType.DELIVERY_FAILED: 'delivery_failed'>
    """
    profile = ErrorProfile(profile)  # "kip" as well as ErrorProfile.KIP
    if isinstance(error, ProduceFailedError):
        return error.failure_type
    if isinstance(error, CommitFailedError):
        return FailureType.TRANSACTION_FAILED
    code = error_code(error)
    if code is not None:
        return _failure_type_of_code(code, profile)
    assert not isinstance(error, int)  # an int is its own code
    if "ProducerFenced" in _client_error_names(error):
        return FailureType.TRANSACTION_FAILED
    return FailureType.DELIVERY_FAILED
