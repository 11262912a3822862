"""A custom RecordsPolicy: only some currencies in a JSON value's "currency" field.

Use it from the config:

```yaml
topics:
  - match: payments
    policies:
      - {custom: {class: "examples.policies:CurrencyPolicy", config: {allowed: [EUR, USD]}}}
```

A custom policy is built as every policy is (`kvproxy.policies.api.RecordsPolicy`): the class's
`create(context, options)` returns it, given the entry's `config`; it has `name`,
`validate(topic, partition, batch)` and `close()`. It rejects by raising
`PolicyViolation(message)` (answered POLICY_VIOLATION, 44, with the message) or by returning a
`Verdict`; any other exception rejects the partition too (fail closed, INVALID_RECORD) and is
logged and counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvproxy.policies.api import (
    ACCEPT,
    PolicyConfigError,
    PolicyContext,
    PolicyViolation,
    ProducedRecords,
    Verdict,
)


class CurrencyPolicy:
    """Every record's value is a JSON object whose "currency" is one of `allowed`."""

    name = "currency"
    OPTIONS: Mapping[str, Any] = {"allowed": None}
    """The options it takes: kvproxy reports any other, with a spelling hint."""

    def __init__(self, allowed: tuple[str, ...]) -> None:
        self.allowed = allowed

    @classmethod
    def create(cls, context: PolicyContext, options: Mapping[str, Any]) -> CurrencyPolicy:
        """What kvproxy calls for each YAML entry naming the class, at start and on reload."""
        allowed = options.get("allowed")
        if not isinstance(allowed, list) or not all(isinstance(c, str) for c in allowed):
            raise PolicyConfigError(
                f"policy {cls.name}: allowed must be a list of currency codes, e.g. [EUR, USD]"
            )
        return cls(tuple(allowed))

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        for record in batch.records():
            try:
                document = json.loads(record.value) if record.value is not None else None
            except ValueError:
                raise PolicyViolation(f"record {record.index} is not JSON") from None
            currency = document.get("currency") if isinstance(document, dict) else None
            if currency not in self.allowed:
                raise PolicyViolation(
                    f"currency {currency} is not allowed; allowed: {', '.join(self.allowed)}"
                )
        return ACCEPT

    def close(self) -> None:
        """Nothing to release."""
