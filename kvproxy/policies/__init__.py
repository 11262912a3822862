"""RecordsPolicy checks: pure, synchronous, shared by the proxy and the Spark audit job."""

from kvproxy.policies.api import (
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
from kvproxy.policies.chain import Mode, PolicyChain
from kvproxy.policies.config import TopicRouting, TopicRule, build_routing
from kvproxy.policies.errors import PolicyConfigError
from kvproxy.policies.producer_state import ProducerStateTracker

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
