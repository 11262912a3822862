"""kvproxy's API table against Kafka's own message specifications, read from the jars of each
tested Kafka version (`common/message/*Response.json` in kafka-clients): every version of an
answer that has a `Host` or `Port` field must be one the table says names brokers (rewritten) or
controllers (not offered), unless the field is one of the documented non-addresses; every API a
specification defines is in the table, under its name, with its newest version."""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvproxy.protocol.api_table import API_TABLE, NOT_NODE_ADDRESSES
from tests.harness.kafka_broker import KAFKA_VERSIONS, kafka_classpath

ADDRESS_FIELDS = frozenset({"host", "port"})


def _specs(version: str) -> dict[str, dict[str, Any]]:
    jar = next(Path(kafka_classpath(version).rstrip("*")).glob("kafka-clients-*.jar"))
    specs = {}
    with zipfile.ZipFile(jar) as archive:
        for name in archive.namelist():
            if name.startswith("common/message/") and name.endswith(".json"):
                text = re.sub(r"^\s*//.*$", "", archive.read(name).decode(), flags=re.M)
                specs[Path(name).stem] = json.loads(text)
    return specs


def _range(versions: str | None, newest: int) -> range | None:
    if versions is None or versions == "none":
        return None
    if versions.endswith("+"):
        return range(int(versions[:-1]), newest + 1)
    low, _, high = versions.partition("-")
    return range(int(low), int(high or low) + 1)


def _address_versions(fields: list[dict[str, Any]], newest: int) -> Iterator[tuple[str, int]]:
    for field in fields:
        versions = _range(field.get("versions"), newest)
        if versions is None:
            continue
        if field["name"].lower() in ADDRESS_FIELDS:
            yield from ((field["name"], v) for v in versions)
        yield from (
            (f"{field['name']}.{name}", v)
            for name, v in _address_versions(field.get("fields", []), newest)
            if v in versions
        )


@pytest.mark.parametrize("version", KAFKA_VERSIONS)
def test_every_answer_naming_a_node_is_rewritten_or_not_offered(version: str) -> None:
    problems = []
    for name, spec in _specs(version).items():
        if spec["type"] != "response" or spec["validVersions"] == "none":
            continue
        key = spec["apiKey"]
        newest = int(spec["validVersions"].split("-")[-1])
        api = API_TABLE.get(key)
        if api is None:
            problems.append(f"{key} {name}: not in the table")
            continue
        if api.name != name.removesuffix("Response") and key != 74:  # renamed in 4.1
            problems.append(f"{key}: the table says {api.name}, Kafka {version} {name}")
        if newest > api.newest:
            problems.append(f"{key} {api.name}: Kafka {version} defines v{newest}")
        fields = list(_address_versions(spec["fields"], newest))
        for struct in spec.get("commonStructs", []):
            fields += _address_versions(struct["fields"], newest)
        for field, at in fields:
            if key in NOT_NODE_ADDRESSES:
                continue
            covered = [
                first for first in (api.brokers_from, api.controllers_from) if first is not None
            ]
            if not any(at >= first for first in covered):
                problems.append(f"{key} {api.name} v{at}: {field} is not rewritten or removed")
    assert not problems, "\n".join(problems)


def test_the_documented_non_addresses_are_real_host_fields() -> None:
    """A `NOT_NODE_ADDRESSES` entry names an API whose answer does have a `Host` field."""
    specs = _specs(KAFKA_VERSIONS[0])
    by_key = {s["apiKey"]: s for s in specs.values() if s["type"] == "response"}
    for key in NOT_NODE_ADDRESSES:
        spec = by_key[key]
        newest = int(spec["validVersions"].split("-")[-1])
        fields = list(_address_versions(spec["fields"], newest))
        for struct in spec.get("commonStructs", []):
            fields += _address_versions(struct["fields"], newest)
        assert fields, f"{key}: no Host field left"
