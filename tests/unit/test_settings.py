"""settings: what the proxy and the audit both read, read and reported one way; and the one
topic pattern matcher of `kvproxy.policies.topic_patterns`."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field

from kvproxy.pipeline.check import _Task
from kvproxy.pipeline.task_data import AuditSettings
from kvproxy.policies.api import INVALID_RECORD_REJECTION, MISSING_KEY, Verdict
from kvproxy.policies.topic_patterns import PatternError, any_of, compile_pattern, is_regex
from kvproxy.protocol import error_codes
from kvproxy.protocol.error_codes import ErrorProfile
from kvproxy.proxy.produce.decision import ProduceSettings
from kvproxy.proxy.produce.engine import ProduceEngine
from kvproxy.settings.addresses import join_host_port, parse_host_port
from kvproxy.settings.errors import profile_code, read_profile
from kvproxy.settings.loading import ConfigError, Section, read_document, report, validate
from kvproxy.settings.rules import RuleSections

# ---- host:port ----


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("kafka:9092", ("kafka", 9092)),
        ("[::1]:9093", ("::1", 9093)),
        ("10.0.0.1:1", ("10.0.0.1", 1)),
    ],
)
def test_addresses_read_and_join_back(text: str, address: tuple[str, int]) -> None:
    assert parse_host_port(text) == address
    assert parse_host_port(join_host_port(*address)) == address


@pytest.mark.parametrize("text", ["kafka", "kafka:", ":9092", "kafka:0", "kafka:65536", "k:x"])
def test_an_address_without_a_port_is_refused_in_one_wording(text: str) -> None:
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        parse_host_port(text)


# ---- the answer code: one mapping for the proxy's answers and the audit's report ----

REJECTIONS = [
    Verdict(error_codes.INVALID_RECORD, "bad", rejection=MISSING_KEY),
    Verdict(error_codes.INVALID_RECORD, "bad", rejection=INVALID_RECORD_REJECTION),
    Verdict(error_codes.POLICY_VIOLATION, "no"),
    Verdict(error_codes.CORRUPT_MESSAGE, "crc"),
]


def test_the_kip_profile_renumbers_record_rejections_only() -> None:
    assert [profile_code(ErrorProfile.KAFKA, v) for v in REJECTIONS] == [87, 87, 44, 2]
    assert [profile_code(ErrorProfile.KIP, v) for v in REJECTIONS] == [45, 85, 44, 2]


@pytest.mark.parametrize("profile", list(ErrorProfile))
def test_the_proxy_and_the_audit_answer_the_same_code(profile: ErrorProfile) -> None:
    routing = RuleSections().build(Path.cwd())
    engine = ProduceEngine(routing, ProduceSettings(profile=profile), lambda topic: None)
    task = _Task(AuditSettings(None, None, str(Path.cwd()), profile=profile.value))
    for verdict in REJECTIONS:
        assert engine.answers.code(verdict, 9) == task.code_of(verdict)
        assert task.code_of(verdict) == profile_code(profile, verdict)
    routing.close()


def test_the_audit_reads_only_the_profile_of_errors() -> None:
    assert read_profile({}) == ("kafka", [])
    assert read_profile({"errors": None}) == ("kafka", [])
    assert read_profile({"errors": "kip"}) == ("kafka", [])  # not a mapping: the proxy says so
    assert read_profile({"errors": {"profile": "kip", "legacy_below": "x"}}) == ("kip", [])
    profile, [problem] = read_profile({"errors": {"profile": "kap"}})
    assert profile == "kafka"
    assert str(problem) == "errors.profile: must be kafka or kip, not 'kap'"


# ---- the policy sections ----


def test_rule_sections_build_the_routing(tmp_path: Path) -> None:
    sections = RuleSections.of(
        {"defaults": {"mode": "warn"}, "topics": [{"match": "o-*", "mode": "enforce"}]}
    )
    assert RuleSections.of(None) == RuleSections(None, None)
    routing = sections.build(tmp_path)
    try:
        assert routing.rule_for("o-1").mode.value == "enforce"
        assert routing.rule_for("p").mode.value == "warn"
    finally:
        routing.close()


# ---- reading a file into a model, problems by line ----


class Inner(Section):
    port: int = Field(default=1, ge=1)


class Outer(Section):
    name: str
    inner: Inner = Inner()


def test_every_problem_is_reported_by_line_at_once(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text("inner:\n  prot: 2\n  port: 0\nextra: 1\n")
    data, lines = read_document(path)
    model, problems = validate(Outer, data)
    assert model is None
    error = report(str(path), problems, lines)
    assert isinstance(error, ConfigError)
    assert str(error).splitlines() == [
        f"{path}: 4 problem(s)",
        f"  {path}:1: name is missing",
        f"  {path}:2: inner.prot: unknown key (did you mean 'port'?)",
        f"  {path}:3: inner.port: must be at least 1, not 0",
        f"  {path}:4: extra: unknown key (known: inner, name)",
    ]
    assert [p.line for p in error.problems] == [1, 2, 3, 4]


def test_a_section_of_the_wrong_type_is_named() -> None:
    model, [problem] = validate(Outer, {"name": "x", "inner": 3})
    assert model is None
    assert str(problem) == "inner must be a mapping, not a number"
    assert validate(Outer, {"name": "x"})[0] == Outer(name="x")


def test_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read") as caught:
        read_document(tmp_path / "nope.yaml")
    assert caught.value.problems == ()


# ---- topic patterns ----


def test_names_globs_and_regexes_match_whole_names() -> None:
    assert compile_pattern("orders")("orders")
    assert not compile_pattern("orders")("orders-1")
    assert compile_pattern("orders-*")("orders-1")
    assert not compile_pattern("orders-*")("Orders-1")  # case-sensitive, as topic names are
    assert compile_pattern("o?[ab]")("oxa")
    assert compile_pattern(r"/orders-\d+/")("orders-12")
    assert not compile_pattern(r"/orders-\d+/")("orders-12x")  # a full match
    assert compile_pattern("/")("/")  # one slash is a name
    assert is_regex("/x/") and not is_regex("/") and not is_regex("x/")
    matches = any_of(["a", "b-*", "/c+/"])
    assert [matches(t) for t in ("a", "b-1", "ccc", "d")] == [True, True, True, False]
    assert not any_of([])("a")


def test_a_bad_regex_is_quoted_with_why() -> None:
    with pytest.raises(PatternError) as caught:
        compile_pattern("/orders-(/")
    assert str(caught.value).startswith("'/orders-(/' is not a valid regular expression: ")
