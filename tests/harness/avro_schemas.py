"""Avro schemas the registry tests register: `Payment` references `Money` by name (a schema
reference between two subjects)."""

from __future__ import annotations

import json

MONEY_AVRO = json.dumps(
    {
        "type": "record",
        "name": "Money",
        "namespace": "shop",
        "fields": [{"name": "currency", "type": "string"}, {"name": "units", "type": "long"}],
    }
)
PAYMENT_AVRO = json.dumps(
    {
        "type": "record",
        "name": "Payment",
        "namespace": "shop",
        "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "shop.Money"}],
    }
)
