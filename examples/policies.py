"""A custom RecordsPolicy: only some currencies in a JSON value's "currency" field.

Use it from the config:

```yaml
topics:
  - match: payments
    policies:
      - {custom: {class: "examples.policies:CurrencyPolicy", config: {allowed: [EUR, USD]}}}
```

A custom policy is any class with `name`, `configure(config)`, `validate(topic, partition,
batch)` and `close()`. It rejects by raising `PolicyViolation(message)` (answered
POLICY_VIOLATION, 44, with the message) or by returning a `Verdict`; any other exception rejects
the partition too (fail closed, INVALID_RECORD) and is logged and counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvproxy.policies import ACCEPT, PolicyViolation, ProducedRecords, Verdict


class CurrencyPolicy:
    """Every record's value is a JSON object whose "currency" is one of `allowed`."""

    name = "currency"

    def __init__(self) -> None:
        self.allowed: tuple[str, ...] = ()

    def configure(self, config: Mapping[str, Any]) -> None:
        allowed = config.get("allowed")
        if not isinstance(allowed, list) or not all(isinstance(c, str) for c in allowed):
            raise ValueError("allowed must be a list of currency codes, e.g. [EUR, USD]")
        unknown = set(config) - {"allowed"}
        if unknown:
            raise ValueError(f"unknown option(s): {', '.join(sorted(unknown))}")
        self.allowed = tuple(allowed)

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
        pass
