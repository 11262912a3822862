"""What the audit's driver hands every task and gets back, as plain data that pickles: the
settings (the policy sections of the proxy's file and what the cluster said), the routing built
from them once per Python worker, the violation columns and the stats of each partition.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvproxy.policies.config import TopicRouting
from kvproxy.settings.rules import RuleSections

if TYPE_CHECKING:
    from kvproxy.registry.catalog import StaticCatalog
    from kvproxy.settings.schema_registry import SchemaRegistryConfig

__all__ = [
    "VIOLATION_FIELDS",
    "AuditSettings",
    "PartitionStats",
    "Violation",
    "routing_for",
]

VIOLATION_FIELDS: tuple[tuple[str, str], ...] = (
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "long"),
    ("timestamp", "long"),
    ("key_preview", "string"),
    ("value_size", "int"),
    ("policy", "string"),
    ("error_code", "int"),
    ("error_name", "string"),
    ("message", "string"),
    ("mode", "string"),
    ("source", "string"),
    ("position", "long"),
)
"""Columns of `violations/`, in order (Spark SQL type names). `offset` is -1 where the record is
not in a log (quarantine entries); `position` is the byte in `source` where its batch starts."""

Violation = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class AuditSettings:
    """Everything a task needs besides its unit of work; plain data, pickled to executors."""

    defaults: Mapping[str, Any] | None
    topics: Sequence[Mapping[str, Any]] | None
    base_dir: str
    profile: str = "kafka"
    compaction: Mapping[str, bool | None] = field(default_factory=dict)
    """topic -> compacted, as the cluster says (used where the YAML does not say)."""
    now_ms: int = 0
    """The time the `timestamps` policy compares against."""
    sample_per_unit: int | None = None
    """Stop a unit after this many records (`--sample`)."""
    bootstrap: tuple[str, ...] = ()
    """The cluster to ask about topics `compaction` does not know yet (quarantined ones)."""
    policies: Mapping[str, str] | None = None
    """Policy name -> `module:attr`, from the driver's installed entry points
    (`plugins.entry_point_targets`): executors given the code as a zip have no such metadata.
    None: scan the installed entry points."""
    default_policies: tuple[str, ...] | None = None
    """The installed default chain (`plugins.default_policies`), found on the driver too."""
    schema_registry: SchemaRegistryConfig | None = None
    """The `schema_registry` section: read on the driver only, and dropped from the settings
    before they ship (its credentials stay on the driver)."""
    schemas: StaticCatalog | None = None
    """What the registry said about every schema id the records carry, asked once on the
    driver (`kvproxy.pipeline.schema_ids`); what `schema` policies read on the executors."""

    def key(self) -> str:
        return json.dumps([self.defaults, self.topics, self.base_dir], sort_keys=True, default=str)


_ROUTINGS: dict[str, TopicRouting] = {}


def routing_for(settings: AuditSettings) -> TopicRouting:
    """The routing of these settings, built once per Python worker."""
    key = settings.key()
    routing = _ROUTINGS.get(key)
    if routing is None:
        routing = RuleSections(settings.defaults, settings.topics).build(
            Path(settings.base_dir),
            policy_targets=settings.policies,
            default_policies=settings.default_policies,
        )
        _ROUTINGS[key] = routing
    return routing


@dataclass(slots=True)
class PartitionStats:
    """What a unit scanned in one topic-partition; merged across units by the driver."""

    topic: str
    partition: int
    records: int = 0
    batches: int = 0
    bytes: int = 0
    control_batches: int = 0
    violations: int = 0
    first_ms: int | None = None
    last_ms: int | None = None
    compacted: bool | None = None
    """As the checks saw it (YAML, else the cluster); None when unknown."""

    def saw_time(self, low: int, high: int) -> None:
        if low >= 0:
            self.first_ms = low if self.first_ms is None else min(self.first_ms, low)
        if high >= 0:
            self.last_ms = high if self.last_ms is None else max(self.last_ms, high)

    def merge(self, other: PartitionStats) -> None:
        self.records += other.records
        self.batches += other.batches
        self.bytes += other.bytes
        self.control_batches += other.control_batches
        self.violations += other.violations
        if self.compacted is None:
            self.compacted = other.compacted
        for value in (other.first_ms, other.last_ms):
            if value is not None:
                self.saw_time(value, value)
