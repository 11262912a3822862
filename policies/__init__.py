"""RecordsPolicy checks: pure, synchronous, shared by the proxy and the Spark audit job."""

from policies.api import (
    ACCEPT,
    INVALID_RECORD_REJECTION,
    MISSING_KEY,
    PolicyViolation,
    ProducedRecords,
    RecordError,
    RecordsPolicy,
    Verdict,
    parse_records,
    record_errors_verdict,
)
from policies.builtin import REGISTRY, PolicyConfigError
from policies.chain import Mode, PolicyChain
from policies.config import TopicRouting, TopicRule, build_routing
from policies.producer_state import ProducerStateTracker

__all__ = [
    "ACCEPT",
    "INVALID_RECORD_REJECTION",
    "MISSING_KEY",
    "REGISTRY",
    "Mode",
    "PolicyChain",
    "PolicyConfigError",
    "PolicyViolation",
    "ProducedRecords",
    "ProducerStateTracker",
    "RecordError",
    "RecordsPolicy",
    "TopicRouting",
    "TopicRule",
    "Verdict",
    "build_routing",
    "parse_records",
    "record_errors_verdict",
]
