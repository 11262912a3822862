"""What the audit reads of a configuration file: the policy sections, `errors.profile` and
`schema_registry`, checked as one (every problem by line), and nothing else of the proxy's.

`kvproxy audit` reads a file this way, and `kvproxy check --for audit` checks one the same way,
so a file written only for backtesting (no `upstream`) is checked as the audit will read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvproxy.policies.config import TopicRouting
from kvproxy.policies.errors import ConfigProblem, PolicyConfigError
from kvproxy.settings.errors import read_profile
from kvproxy.settings.loading import read_document, report
from kvproxy.settings.rules import RuleSections
from kvproxy.settings.schema_registry import (
    SchemaRegistryConfig,
    read_registry_section,
    registry_missing,
)

__all__ = ["AuditFile", "read_audit_file"]


@dataclass(frozen=True)
class AuditFile:
    """The sections of a file the audit uses, checked; `routing` built from them."""

    rules: RuleSections
    profile: str
    schema_registry: SchemaRegistryConfig | None
    base_dir: Path
    routing: TopicRouting


def read_audit_file(path: Path, policy_targets: Mapping[str, str] | None = None) -> AuditFile:
    """The file's audit sections, or one ConfigError naming every problem by line.
    `policy_targets` as `build_routing` takes it (the policies installed, by name)."""
    document, lines = read_document(path)
    if document is None:
        document = {}
    problems: list[ConfigProblem] = []
    profile, wrong = read_profile(document)
    problems.extend(wrong)
    registry, registry_problems = read_registry_section(document)
    problems.extend(registry_problems)
    rules = RuleSections.of(document)
    base_dir = path.resolve().parent
    routing = None
    try:
        routing = rules.build(base_dir, policy_targets=policy_targets)
    except PolicyConfigError as exc:
        problems.extend(exc.problems)
    else:
        missing = None if registry is not None or registry_problems else registry_missing(routing)
        if missing is not None:
            problems.append(missing)
    if problems or routing is None:
        if routing is not None:
            routing.close()
        raise report(str(path), problems, lines)
    return AuditFile(rules, profile, registry, base_dir, routing)
