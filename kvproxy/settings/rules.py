"""The policy sections (`defaults`, `topics`): kept as data when the file is read, and built into
a `TopicRouting` by `kvproxy.policies.config.build_routing`, which reports their problems in its
words.

The proxy builds them to serve and the audit to check stored records with the same rules, so a
backtest answers what the proxy would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvproxy.policies.config import TopicRouting, build_routing
from kvproxy.policies.errors import KeyPath
from kvproxy.policies.producer_state import ProducerStateTracker

__all__ = ["RULE_SECTIONS", "RuleSections"]

RULE_SECTIONS: frozenset[KeyPath] = frozenset({("defaults",), ("topics",)})
"""The sections build_routing checks (and words its problems for) when the rules are built."""


@dataclass(frozen=True, slots=True)
class RuleSections:
    """The policy sections of a file, as written (plain data: the audit pickles them)."""

    defaults: Mapping[str, Any] | None = None
    topics: Sequence[Mapping[str, Any]] | None = None

    @classmethod
    def of(cls, document: Mapping[str, Any] | None) -> RuleSections:
        """The sections of a whole file's data (absent ones are None)."""
        document = document or {}
        return cls(document.get("defaults"), document.get("topics"))

    def build(
        self,
        base_dir: Path,
        *,
        producer_state: ProducerStateTracker | None = None,
        policy_targets: Mapping[str, str] | None = None,
        default_policies: Sequence[str] | None = None,
    ) -> TopicRouting:
        """The rules, built (custom classes imported, schema files read); PolicyConfigError
        lists every problem. Relative paths in policies resolve against `base_dir`;
        `policy_targets` and `default_policies` as `build_routing` takes them."""
        return build_routing(
            self.defaults,
            self.topics,
            Path(base_dir),
            producer_state=producer_state,
            policy_targets=policy_targets,
            default_policies=default_policies,
        )
