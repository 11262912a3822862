"""`forbidden_word`: refuses a partition whose records' values contain a configured word.

```yaml
topics:
  - match: chat
    policies: [{forbidden_word: {word: spam}}]   # added to the default checks
```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvproxy.policies.api import (
    ACCEPT,
    Need,
    PolicyConfigError,
    PolicyContext,
    ProducedRecords,
    RecordError,
    Verdict,
)
from kvproxy.protocol import error_codes

__all__ = ["ForbiddenWordPolicy"]


class ForbiddenWordPolicy:
    """Every record whose value holds `word` is listed; the partition is refused with
    POLICY_VIOLATION. `accepted` counts the records the broker then took (its `observe`)."""

    name = "forbidden_word"
    OPTIONS: Mapping[str, Any] = {"word": None}
    """The options it takes: kvproxy reports any other, with a spelling hint."""
    needs = frozenset({Need.BROKER_ANSWER})
    """What it needs from the proxy: to see the broker's answer (`observe`)."""

    def __init__(self, word: bytes) -> None:
        self.word = word
        self.accepted = 0

    @classmethod
    def create(cls, context: PolicyContext, options: Mapping[str, Any]) -> ForbiddenWordPolicy:
        """What kvproxy calls for each YAML entry naming `forbidden_word`."""
        word = options.get("word")
        if not isinstance(word, str) or not word:
            raise PolicyConfigError(f"policy {cls.name}: option word must be a non-empty string")
        return cls(word.encode())

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        errors = tuple(
            RecordError(record.index, f"value contains {self.word.decode()!r}")
            for record in batch.records()
            if record.value is not None and self.word in record.value
        )
        if not errors:
            return ACCEPT
        return Verdict(
            error_codes.POLICY_VIOLATION,
            f"{len(errors)} record(s) in {batch.topic_partition} contain {self.word.decode()!r}",
            record_errors=errors,
        )

    def observe(
        self, topic: str, partition: int, produced: ProducedRecords, error_code: int
    ) -> None:
        """The broker's answer to a partition this policy let through."""
        if error_code == 0:
            self.accepted += sum(max(b.record_count, 0) for b in produced.batches)

    def close(self) -> None:
        """Nothing to release."""
