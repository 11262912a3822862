"""RecordsPolicy checks: pure, synchronous, shared by the proxy and the Spark audit job."""

from policies.api import (
    ACCEPT,
    INVALID_RECORD_REJECTION,
    MISSING_KEY,
    Need,
    PolicyViolation,
    ProducedRecords,
    RecordError,
    RecordsPolicy,
    Verdict,
    parse_records,
    record_errors_verdict,
)
from policies.builtin import PolicyConfigError
from policies.chain import Mode, PolicyChain
from policies.config import TopicRouting, TopicRule, build_routing
from policies.producer_state import ProducerStateTracker

__all__ = [
    "ACCEPT",
    "INVALID_RECORD_REJECTION",
    "MISSING_KEY",
    "Mode",
    "Need",
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
