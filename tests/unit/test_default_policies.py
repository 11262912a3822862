"""A topic entry's `policies:` add to the defaults' policies; `default_policies: drop` is the
explicit way to run only the entry's own, and `kvproxy check` says which of the two each rule
does (`defaults` and `topics` in docs/configuration.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kvproxy.cli import main
from kvproxy.policies.config import build_routing
from kvproxy.policies.errors import PolicyConfigError

BROKER_CHECKS = ("batch_integrity", "crc", "timestamps", "compacted_key")
ROOT = Path(__file__).resolve().parents[2]


def test_a_topics_policies_are_added_to_the_defaults() -> None:
    routing = build_routing(None, [{"match": "orders", "policies": ["json"]}], Path("."))
    rule = routing.rule_for("orders")
    assert rule.policy_names == (*BROKER_CHECKS, "json")
    assert rule.defaults_summary == "default policies kept"
    routing.close()


def test_a_policy_the_defaults_name_too_runs_once_with_the_entrys_options() -> None:
    entry = {"match": "orders", "policies": [{"timestamps": {"after_max_ms": 60000}}]}
    routing = build_routing(None, [entry], Path("."))
    chain = routing.chain_for("orders")
    assert sorted(chain.names) == sorted(BROKER_CHECKS)  # timestamps once
    assert "timestamp_after_max_ms" not in routing.settings_needed("orders")  # the option's
    routing.close()


def test_default_policies_drop_runs_only_the_entrys_own_and_names_what_it_drops() -> None:
    entry = {"match": "raw", "default_policies": "drop", "policies": ["crc", "json"]}
    routing = build_routing(None, [entry], Path("."))
    rule = routing.rule_for("raw")
    assert rule.policy_names == ("crc", "json")
    assert rule.dropped_defaults == ("batch_integrity", "timestamps", "compacted_key")
    assert rule.defaults_summary == (
        "default policies dropped (default_policies: drop): batch_integrity, timestamps, "
        "compacted_key"
    )
    assert routing.rule_for("other").defaults_summary == ""  # the defaults themselves
    routing.close()


def test_default_policies_keep_is_the_default_and_a_wrong_value_is_named() -> None:
    kept = build_routing(None, [{"match": "a", "default_policies": "keep"}], Path("."))
    assert kept.rule_for("a").policy_names == BROKER_CHECKS
    kept.close()
    with pytest.raises(PolicyConfigError) as caught:
        build_routing(None, [{"match": "a", "default_policies": False}], Path("."))
    assert [str(p) for p in caught.value.problems] == [
        "topics[0]: default_policies must be keep or drop, not False"
    ]


def test_check_says_per_rule_whether_the_default_policies_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "kvproxy.yaml").write_text(
        "upstream: {bootstrap_servers: [k:1]}\n"
        "topics:\n"
        "  - {match: orders, policies: [json]}\n"
        "  - {match: raw, default_policies: drop, policies: [crc]}\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["check", "-c", "kvproxy.yaml"]) == 0
    out = capsys.readouterr().out
    assert (
        "    orders: mode enforce, compacted from the cluster, policies: batch_integrity, crc, "
        "timestamps, compacted_key, json; default policies kept\n"
    ) in out
    assert (
        "    raw: mode enforce, compacted from the cluster, policies: crc; default policies "
        "dropped (default_policies: drop): batch_integrity, timestamps, compacted_key\n"
    ) in out
    assert (
        "    (every other topic): mode enforce, compacted from the cluster, policies: "
        "batch_integrity, crc, timestamps, compacted_key\n"
    ) in out


def test_the_schema_registry_example_keeps_the_broker_checks() -> None:
    """docs/schema-registry.md's first example, with its registry section left out."""
    text = (ROOT / "docs" / "schema-registry.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block is not None
    document = yaml.safe_load(block.group(1))
    topics = [
        {**entry, "policies": [p for p in entry["policies"] if "schema" not in p]}
        for entry in document["topics"]
    ]
    routing = build_routing(document.get("defaults"), topics, Path("."))
    for rule in routing.rules:
        assert set(BROKER_CHECKS) <= set(rule.policy_names), rule.match
    routing.close()


def test_a_rule_whose_mode_is_off_says_nothing_of_the_defaults() -> None:
    routing = build_routing(None, [{"match": "tmp", "mode": "off"}], Path("."))
    assert routing.rule_for("tmp").policy_names == ()
    assert routing.rule_for("tmp").defaults_summary == ""
    routing.close()
