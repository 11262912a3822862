"""Producer helpers on aiokafka for the error semantics kvproxy (and KIP-467) bring.

- `ResilientProducer`: per-record outcomes; the good records of a refused batch are sent again;
  idempotence "off" / "requested" / "required".
- `classify` / `failure_type`: one place that says what an error means (retriable, abortable,
  fatal; which FailureType), from the project's error table.
- `run_transaction` (producer.transactions): the begin / send / commit-or-abort template.

See docs/producer.md.
"""

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
from kvproxy.producer.resilient import ResilientProducer

__all__ = [
    "Classification",
    "CommitFailedError",
    "FailureType",
    "IdempotenceUnavailableError",
    "ProduceFailedError",
    "ResilientProducer",
    "classify",
    "error_code",
    "failure_type",
]
