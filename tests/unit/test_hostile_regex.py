"""Regular expressions from outside the process (a registry's JSON Schema, the config's topic
rules and `key_pattern`) never backtrack: they run on RE2, a pattern RE2 cannot run is refused
when it is compiled, a name that cannot be a topic is never matched against any rule, and the
number of topic rules is capped.

An exponential pattern against 60 characters would take years with a backtracking engine: before
they ran on RE2 these tests hung (`re` never looks at signals, so pytest-timeout cannot end them
either; only killing the process does)."""

from __future__ import annotations

import fnmatch
import json
import random
from pathlib import Path
from typing import Any

import pytest

from kvproxy.policies import PolicyConfigError, ProducedRecords, parse_records
from kvproxy.policies.api import PolicyContext
from kvproxy.policies.config import MAX_TOPIC_RULES, build_routing
from kvproxy.policies.plugins import find_factory
from kvproxy.policies.schemas.formats import SchemaCompileError, compile_schema
from kvproxy.policies.schemas.model import RegisteredSchema, SchemaType
from kvproxy.policies.topic_patterns import FirstMatch, compile_pattern, glob_regex
from kvproxy.protocol import error_codes
from kvproxy.protocol.records import build_batch
from kvproxy.proxy.config.proxy_config import load_config_and_rules
from kvproxy.settings.loading import ConfigError

EXPONENTIAL = "^(a+)+$"
HOSTILE_TEXT = "a" * 60 + "!"
"""2^60 ways for a backtracking engine to fail `^(a+)+$`; RE2 reads it once."""


def _json_schema(schema: dict[str, Any]) -> Any:
    return compile_schema(RegisteredSchema(1, SchemaType.JSON, json.dumps(schema)))


# ---- JSON Schemas served by a registry ----


def test_a_registry_pattern_that_backtracks_exponentially_is_checked_in_linear_time() -> None:
    compiled = _json_schema({"type": "string", "pattern": EXPONENTIAL})
    assert compiled.mismatch(json.dumps(HOSTILE_TEXT).encode(), 0) == (
        "data must match pattern ^(a+)+$"
    )
    assert compiled.mismatch(b'"aaaa"', 0) is None


def test_a_registry_pattern_property_that_backtracks_is_checked_in_linear_time() -> None:
    compiled = _json_schema(
        {"type": "object", "patternProperties": {EXPONENTIAL: {"type": "integer"}}}
    )
    document = {HOSTILE_TEXT: "not checked: the name does not match", "aaaa": "x"}
    assert compiled.mismatch(json.dumps(document).encode(), 0) == "data.aaaa must be integer"


def test_required_names_are_matched_against_pattern_properties_in_linear_time() -> None:
    """fastjsonschema matches `required` names against `patternProperties` while it compiles."""
    schema = {
        "type": "object",
        "additionalProperties": False,
        "patternProperties": {EXPONENTIAL: {}},
        "required": [HOSTILE_TEXT],
    }
    with pytest.raises(SchemaCompileError, match="are required but not allowed"):
        _json_schema(schema)


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"pattern": r"^(a)\1$"}, r"pattern '^(a)\\1\\Z' is not supported: invalid escape"),
        ({"patternProperties": {"(?=x)": {}}}, "pattern '(?=x)' is not supported"),
        ({"pattern": "(?<=a)b"}, "no backreferences, lookahead or lookbehind"),
    ],
)
def test_a_registry_pattern_re2_cannot_run_makes_the_schema_unusable(
    schema: dict[str, Any], says: str
) -> None:
    with pytest.raises(SchemaCompileError) as refused:
        _json_schema(schema)
    assert str(refused.value).startswith("JSON schema does not compile: ")
    assert says in str(refused.value)


def test_a_value_checked_as_format_regex_is_compiled_by_re2() -> None:
    compiled = _json_schema({"type": "string", "format": "regex"})
    assert compiled.mismatch(b'"^[a-z]+$"', 0) is None
    assert compiled.mismatch(json.dumps(r"(a)\1").encode(), 0) == "data must be a valid regex"


def test_the_librarys_own_formats_still_work() -> None:
    compiled = _json_schema({"type": "string", "format": "email"})  # lookahead: stays with `re`
    assert compiled.mismatch(b'"a@example.com"', 0) is None
    assert compiled.mismatch(b'"a..b@example.com"', 0) == "data must be email"


def test_a_dollar_still_means_the_end_of_the_text() -> None:
    compiled = _json_schema({"type": "string", "pattern": "^ab$"})
    assert compiled.mismatch(b'"ab"', 0) is None
    assert compiled.mismatch(b'"ab\\n"', 0) == "data must match pattern ^ab$"


# ---- patterns from the config ----


def _produced(key: bytes) -> ProducedRecords:
    result = parse_records(
        "t",
        0,
        build_batch([(key, b"v", None, None)]),
        produce_version=9,
        acks=-1,
        transactional_id=None,
        compacted=None,
        now_ms=0,
    )
    assert isinstance(result, ProducedRecords)
    return result


def _policy(name: str, options: dict[str, Any], base_dir: Path = Path()) -> Any:
    policy = find_factory(name)(PolicyContext(base_dir=base_dir))
    policy.configure(options)
    return policy


def test_key_pattern_from_the_config_runs_in_linear_time() -> None:
    policy = _policy("key_pattern", {"regex": EXPONENTIAL})
    verdict = policy.validate("t", 0, _produced(HOSTILE_TEXT.encode()))
    assert verdict.code == error_codes.INVALID_RECORD
    assert "does not match ^(a+)+$" in verdict.record_errors[0].message
    assert policy.validate("t", 0, _produced(b"aaaa")).ok


def test_key_pattern_re2_cannot_run_is_a_config_error() -> None:
    with pytest.raises(PolicyConfigError) as refused:
        _policy("key_pattern", {"regex": r"(\w)\1"})
    assert "bad regex '(\\\\w)\\\\1': invalid escape sequence" in str(refused.value)
    assert "RE2 syntax: no backreferences, lookahead or lookbehind" in str(refused.value)


def test_a_json_schema_file_pattern_runs_in_linear_time(tmp_path: Path) -> None:
    (tmp_path / "key.json").write_text(json.dumps({"pattern": EXPONENTIAL}))
    policy = _policy("json_schema", {"value": "key.json"}, tmp_path)
    result = parse_records(
        "t",
        0,
        build_batch([(b"k", json.dumps(HOSTILE_TEXT).encode(), None, None)]),
        produce_version=9,
        acks=-1,
        transactional_id=None,
        compacted=None,
        now_ms=0,
    )
    assert isinstance(result, ProducedRecords)
    verdict = policy.validate("t", 0, result)
    assert "does not match key.json: data must match pattern" in verdict.record_errors[0].message


# ---- topic rules ----


def test_a_topic_rule_that_backtracks_runs_in_linear_time() -> None:
    routing = build_routing(None, [{"match": "/(a|aa)+b/", "mode": "warn"}], Path())
    assert routing.rule_for("a" * 200) is routing.default  # a legal name: matched, by RE2
    assert routing.rule_for("a" * 60 + "b").match == "/(a|aa)+b/"


def test_a_name_that_cannot_be_a_topic_is_never_matched() -> None:
    """16,000 characters: matched by a backtracking engine against `(a|aa)+b`, forever; Kafka
    answers UNKNOWN_TOPIC_OR_PARTITION without looking further, and so does the rule."""
    routing = build_routing(None, [{"match": "/(a|aa)+b/", "mode": "warn"}], Path())
    rule = routing.rule_for("a" * 16_000)
    assert rule is routing.no_such_topic
    verdict = rule.chain.check(_produced(b"k"))
    assert verdict.code == error_codes.UNKNOWN_TOPIC_OR_PARTITION
    assert verdict.resend  # nothing kept: the broker keeps nothing either
    assert routing.cached_topics == 0


def test_a_topic_name_is_matched_once_then_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    routing = build_routing(None, [{"match": "/.*-.*-events/"}], Path())
    calls: list[str] = []
    index = FirstMatch.index
    monkeypatch.setattr(
        FirstMatch, "index", lambda self, name: calls.append(name) or index(self, name)
    )
    for _ in range(3):
        assert routing.rule_for("a-b-events").match == "/.*-.*-events/"
        assert routing.rule_for("x" * 250) is routing.no_such_topic
    assert calls == ["a-b-events"]


def test_the_first_matching_rule_wins_among_thousands() -> None:
    """`FirstMatch` answers what trying each pattern in turn would."""
    chance = random.Random(28)
    patterns: list[str] = []
    for _ in range(3_000):
        kind = chance.randrange(4)
        if kind == 0:
            patterns.append(f"t{chance.randrange(500)}")
        elif kind == 1:
            patterns.append(f"t{chance.randrange(50)}*")
        elif kind == 2:
            patterns.append(f"/t{chance.randrange(50)}-[a-c]+/")
        else:
            patterns.append(f"t?{chance.randrange(10)}[!x]")
    matchers = [compile_pattern(pattern) for pattern in patterns]
    first = FirstMatch(patterns)
    names = [
        f"t{chance.randrange(600)}{chance.choice(['', '-ab', 'q', '-x', '1y'])}"
        for _ in range(2_000)
    ]
    for name in names:
        expected = next((i for i, matches in enumerate(matchers) if matches(name)), None)
        assert first.index(name) == expected, name


@pytest.mark.parametrize(
    "glob", ["orders-*", "o?[ab]", "[!a]*", "[]x]", "a[", "[a-c]-*.log", "*[*]*", "x\\y", "[\\]]"]
)
def test_a_glob_matches_what_fnmatch_matches(glob: str) -> None:
    matches = compile_pattern(glob)
    for name in [
        "orders-1",
        "oxa",
        "oxc",
        "b",
        "a",
        "]",
        "x",
        "a[",
        "b-1.log",
        "a*b",
        "x\\y",
        "\\",
    ]:
        assert matches(name) == fnmatch.fnmatchcase(name, glob), (glob, name, glob_regex(glob))


def test_more_topic_rules_than_allowed_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    """190,002 rules from one alias repeated, as a 760 KB file did."""
    path = tmp_path / "kvproxy.yaml"
    aliases = ", ".join(["*r"] * 190_001)
    path.write_text(
        "upstream: {bootstrap_servers: ['127.0.0.1:9092']}\n"
        f"topics: [&r {{match: 'orders-*', mode: warn}}, {aliases}]\n"
    )
    assert path.stat().st_size > 700_000
    with pytest.raises(ConfigError) as refused:
        load_config_and_rules(path)
    assert str(path) in str(refused.value)
    assert f"topics has 190,002 rules, more than the {MAX_TOPIC_RULES:,} allowed" in str(
        refused.value
    )


def test_as_many_topic_rules_as_allowed_load() -> None:
    topics = [{"match": f"/t{n}-[a-z]+/", "mode": "warn"} for n in range(MAX_TOPIC_RULES)]
    routing = build_routing(None, topics, Path())
    assert (
        routing.rule_for(f"t{MAX_TOPIC_RULES - 1}-abc").match == f"/t{MAX_TOPIC_RULES - 1}-[a-z]+/"
    )
    assert routing.rule_for("t1-") is routing.default
