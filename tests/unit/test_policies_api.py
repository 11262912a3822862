"""policies: the API values, parse_records, the chain, and YAML routing."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kvproxy.policies import (
    ACCEPT,
    Mode,
    PolicyChain,
    PolicyConfigError,
    PolicyViolation,
    ProducedRecords,
    RecordError,
    Verdict,
    build_routing,
    parse_records,
    record_errors_verdict,
)
from kvproxy.policies.api import PARSING
from kvproxy.policies.chain import CRASH_LOG_INTERVAL_S
from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch

NOW = 1_700_000_000_000
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def produced(
    raw: bytes | None, *, version: int = 9, topic: str = "t", **kw: Any
) -> ProducedRecords:
    result = parse_records(
        topic,
        kw.pop("partition", 0),
        raw,
        produce_version=version,
        acks=kw.pop("acks", -1),
        transactional_id=None,
        compacted=kw.pop("compacted", None),
        now_ms=NOW,
    )
    assert isinstance(result, ProducedRecords), result
    return result


def records(n: int, key: bytes | None = b"k") -> list[Any]:
    return [(key, b'{"n": %d}' % i, None, NOW) for i in range(n)]


# -- values -----------------------------------------------------------------------------------


def test_verdict_defaults_and_ok() -> None:
    assert ACCEPT.ok and ACCEPT.code == 0 and ACCEPT.record_errors == () and ACCEPT.policy is None
    assert not Verdict(87).ok
    assert Verdict(87).with_policy("x").policy == "x"
    assert Verdict(87, policy="y").with_policy("x").policy == "y"


def test_record_errors_message_is_kafkas_format() -> None:
    errors = [RecordError(i, f"bad {i}") for i in (1, 3, 4, 7)]
    verdict = record_errors_verdict(errors)
    assert verdict.code == 87 and verdict.rejection == "invalid_record"
    assert verdict.message == (
        "One or more records have been rejected due to 4 record errors in total, and only "
        "showing the first three errors at most: [RecordError(batchIndex=1, message='bad 1'), "
        "RecordError(batchIndex=3, message='bad 3'), RecordError(batchIndex=4, message='bad 4')]"
    )
    assert [e.index for e in verdict.record_errors] == [1, 3, 4, 7]
    ts = record_errors_verdict(errors[:1], code=32)
    assert ts.message == "One or more records have been rejected due to invalid timestamp"


# -- parse_records ----------------------------------------------------------------------------


def test_parse_records_renumbers_across_batches() -> None:
    raw = build_batch(records(2), magic=1) + build_batch(records(3), magic=1, codec=Codec.GZIP)
    p = produced(raw, version=2)
    assert len(p.batches) == 3
    assert [r.index for r in p.records()] == [0, 1, 2, 3, 4]
    assert [r.value for r in p.records()] == [b'{"n": 0}', b'{"n": 1}'] + [
        b'{"n": %d}' % i for i in range(3)
    ]
    assert p.record_tuple() is p.record_tuple()  # decoded once
    assert p.topic_partition == "t-0"


@pytest.mark.parametrize(
    ("raw", "magic"),
    [(b"\x00" * 8 + b"\x00\x00\x00\x50" + b"\x05" * 80, 5), (b"x" * 200, ord("x"))],
)
def test_parse_records_garbage_is_corrupt_message(raw: bytes, magic: int) -> None:
    """In Kafka's words (its batch reader's InvalidRecordException, read as CORRUPT_MESSAGE)."""
    verdict = parse_records(
        "t", 3, raw, produce_version=9, acks=1, transactional_id=None, compacted=None, now_ms=NOW
    )
    assert isinstance(verdict, Verdict)
    assert verdict.code == 2 and verdict.policy == PARSING  # no chain named who judges parsing
    assert verdict.message == f"Invalid magic found in record: {magic}"


def test_bytes_that_do_not_parse_are_refused_in_the_name_the_chain_declares() -> None:
    """The policy that declares `judges_parsing` (the default chain's `batch_integrity`) gives
    its name to CORRUPT_MESSAGE for bytes that are not batches; a chain without one, the
    framework's own `record_parsing`. Nothing in the framework names the policy."""
    default = build_routing(None, None, Path(".")).chain_for("t")
    json_only = build_routing({"policies": ["json"]}, None, Path(".")).chain_for("t")
    assert (default.parsed_by, json_only.parsed_by) == ("batch_integrity", PARSING)
    for chain in (default, json_only):
        verdict = parse_records(
            "t", 0, b"x" * 200, produce_version=9, acks=1, transactional_id=None,
            compacted=None, now_ms=NOW, parsed_by=chain.parsed_by,
        )  # fmt: skip
        assert isinstance(verdict, Verdict) and verdict.policy == chain.parsed_by


@pytest.mark.parametrize("cut", [b"garbage", b"\x00" * 11, build_batch(records(3))[:-5]])
def test_parse_records_no_whole_batch_is_no_batch_on_v3_plus(cut: bytes) -> None:
    """Shorter than a batch header, or a batch cut short: Kafka's batch iterator finds no batch
    (INVALID_RECORD on v3+); on v0-v2 the proxy answers CORRUPT_MESSAGE."""
    for version, code in ((9, 87), (2, 2)):
        verdict = parse_records(
            "t",
            0,
            cut,
            produce_version=version,
            acks=1,
            transactional_id=None,
            compacted=None,
            now_ms=NOW,
        )
        assert isinstance(verdict, Verdict) and verdict.code == code


@pytest.mark.parametrize("raw", [None, b""])
def test_empty_records_v3_rejected_v2_accepted(raw: bytes | None) -> None:
    chain = build_routing(None, None, Path(".")).chain_for("t")
    v9 = chain.check(produced(raw, version=9))
    assert v9.code == 87 and v9.policy == "batch_integrity"
    assert v9.message == (
        "Produce requests with version 9 must have at least one record batch per partition"
    )
    assert chain.check(produced(raw, version=2)).ok


# -- chain ------------------------------------------------------------------------------------


class Stub:
    def __init__(self, name: str, action: Any = None) -> None:
        self.name = name
        self.action = action
        self.calls = 0
        self.closed = False

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        self.calls += 1
        if isinstance(self.action, BaseException):
            raise self.action
        return self.action or ACCEPT

    def close(self) -> None:
        self.closed = True


def test_chain_stops_at_first_failure_and_names_the_policy() -> None:
    a, b, c = Stub("a"), Stub("b", Verdict(10, "too big")), Stub("c")
    chain = PolicyChain([a, b, c], Mode.ENFORCE)
    verdict = chain.check(produced(build_batch(records(1))))
    assert (verdict.code, verdict.message, verdict.policy) == (10, "too big", "b")
    assert (a.calls, b.calls, c.calls) == (1, 1, 0)
    assert chain.check(produced(build_batch(records(1)))).code == 10
    chain.close()
    assert a.closed and b.closed and c.closed


def test_chain_policy_violation_is_44_with_message() -> None:
    chain = PolicyChain([Stub("mine", PolicyViolation("no EUR today"))])
    verdict = chain.check(produced(build_batch(records(1))))
    assert (verdict.code, verdict.message, verdict.policy) == (44, "no EUR today", "mine")


def test_chain_crash_fails_closed_logged_once_per_minute_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = [1000.0]
    chain = PolicyChain([Stub("boom", ValueError("nope"))], clock=lambda: clock[0])
    batch = produced(build_batch(records(1)))
    with caplog.at_level(logging.ERROR, logger="kvproxy.policies"):
        for _ in range(3):
            verdict = chain.check(batch)
            assert verdict.code == 87 and verdict.policy == "boom"
            assert verdict.message == "policy boom failed: ValueError('nope')"
        assert len(caplog.records) == 1
        assert caplog.records[0].exc_info is not None  # with its traceback
        clock[0] += CRASH_LOG_INTERVAL_S - 1
        chain.check(batch)
        assert len(caplog.records) == 1
        clock[0] += 1
        chain.check(batch)
        assert len(caplog.records) == 2
    assert chain.crash_counts == {"boom": 5}


def test_chain_decode_error_inside_a_policy_is_corrupt_message() -> None:
    raw = bytearray(build_batch(records(3), codec=Codec.GZIP))
    raw[-4:] = b"\xff\xff\xff\xff"  # the gzip trailer: header parses, records do not
    chain = build_routing({"policies": ["compacted_key"]}, None, Path(".")).chain_for("t")
    verdict = chain.check(produced(bytes(raw), compacted=True))
    assert verdict.code == 2 and verdict.policy == "compacted_key"


def test_off_chain_is_empty_and_mode_kept() -> None:
    assert PolicyChain([Stub("a")], Mode.OFF).policies == ()
    assert PolicyChain([Stub("a")], Mode.WARN).mode is Mode.WARN
    warn = PolicyChain([Stub("a", Verdict(87))], Mode.WARN)
    assert warn.check(produced(build_batch(records(1)))).code == 87  # caller decides


# -- routing ----------------------------------------------------------------------------------


def test_routing_exact_glob_regex_first_match_defaults_inherit() -> None:
    routing = build_routing(
        {"mode": "warn", "policies": ["crc"]},
        [
            {"match": "orders", "compacted": True, "policies": ["json"]},
            {"match": "orders.*", "mode": "enforce"},
            {"match": "/pay(ments|outs)-[0-9]+/", "policies": [{"acks": {"allowed": [-1]}}]},
            {"match": "orders.eu", "policies": ["json"]},  # never reached: the glob wins
        ],
        Path("."),
    )
    assert routing.rule_for("orders").policy_names == ("crc", "json")  # added to the defaults
    assert routing.compacted_override("orders") is True
    assert routing.mode_for("orders") is Mode.WARN  # inherited
    assert routing.rule_for("orders.eu").match == "orders.*"
    assert routing.chain_for("orders.eu").names == ("crc",)  # inherited policies
    assert routing.mode_for("orders.eu") is Mode.ENFORCE
    assert routing.chain_for("payouts-7").names == ("crc", "acks")
    assert routing.rule_for("payouts-7x").match is None  # fullmatch only
    assert routing.rule_for("xorders").match is None
    assert routing.chain_for("other").names == ("crc",)
    assert routing.mode_for("other") is Mode.WARN
    assert routing.compacted_override("other") is None
    assert routing.chain_for("orders.eu") is routing.chain_for("orders.us")  # one chain per rule
    routing.close()


def test_default_defaults() -> None:
    routing = build_routing(None, None, Path("."))
    assert routing.chain_for("x").names == ("batch_integrity", "crc", "timestamps", "compacted_key")
    assert routing.mode_for("x") is Mode.ENFORCE
    assert routing.producer_state is not None


def test_yaml_off_means_mode_off() -> None:
    import yaml

    topics = yaml.safe_load("- {match: a, mode: off}")
    routing = build_routing(None, topics, Path("."))
    assert routing.mode_for("a") is Mode.OFF and routing.chain_for("a").policies == ()


@pytest.mark.parametrize(
    ("defaults", "topics", "expected"),
    [
        ({"policies": ["nope"]}, None, "defaults.policies[0]: unknown policy 'nope'"),
        (
            None,
            [{"match": "a", "policies": [{"crc": {"x": 1}}]}],
            "topics[0].policies[0]: policy crc: unknown option 'x'",
        ),
        (None, [{"match": "/a(/"}], "topics[0]: match '/a(/' is not a valid regular expression"),
        (None, [{"match": "a", "colour": 1}], "topics[0].colour: unknown key"),
        (None, [{"match": "a", "mode": "loud"}], "mode must be one of enforce, warn, off"),
        (None, [{"policies": []}], "topics[0]: match is missing"),
        (None, [{"match": ""}], "topics[0]: match must be a non-empty string"),
        (None, [{"match": "a", "policies": [{"crc": None, "json": None}]}], "one-key mapping"),
        (
            None,
            [{"match": "a", "policies": [{"custom": {"class": "no_such_mod:X"}}]}],
            "cannot import no_such_mod",
        ),
        (
            None,
            [{"match": "a", "policies": [{"custom": {"class": "json:NoSuch"}}]}],
            "json has no NoSuch",
        ),
        (None, [{"match": "a", "policies": [{"custom": {"class": "nocolon"}}]}], "'module:Class'"),
        (
            None,
            [{"match": "a", "policies": [{"timestamps": {"after_max_ms": "x"}}]}],
            "after_max_ms must be an integer",
        ),
        (
            None,
            [{"match": "a", "policies": [{"json_schema": {"value": "missing.json"}}]}],
            "no such file",
        ),
        (None, [{"match": "a", "policies": ["json_schema"]}], "json_schema: option value"),
        (None, [{"match": "a", "compacted": "yes"}], "compacted must be true, false or absent"),
        ({"mode": "enforce", "extra": 1}, None, "defaults.extra: unknown key"),
    ],
)
def test_config_errors_name_entry_and_policy(defaults: Any, topics: Any, expected: str) -> None:
    with pytest.raises(PolicyConfigError) as info:
        build_routing(defaults, topics, Path("."))
    assert expected in str(info.value)


def test_custom_policy_from_examples(tmp_path: Path) -> None:
    routing = build_routing(
        None,
        [
            {
                "match": "payments",
                "policies": [
                    {
                        "custom": {
                            "class": "examples.policies:CurrencyPolicy",
                            "config": {"allowed": ["EUR", "USD"]},
                        }
                    }
                ],
            }
        ],
        EXAMPLES,
    )
    chain = routing.chain_for("payments")
    good = [(b"k", b'{"currency": "EUR"}', None, NOW), (b"k", b'{"currency": "USD"}', None, NOW)]
    assert chain.check(produced(build_batch(good), topic="payments")).ok
    bad = [*good, (b"k", b'{"currency": "XYZ"}', None, NOW)]
    verdict = chain.check(produced(build_batch(bad), topic="payments"))
    assert verdict.code == 44
    assert verdict.message == "currency XYZ is not allowed; allowed: EUR, USD"
    assert verdict.policy == "currency"


def test_custom_policy_bad_config_is_config_error() -> None:
    with pytest.raises(PolicyConfigError, match="allowed must be a list of currency codes"):
        build_routing(
            None,
            [
                {
                    "match": "p",
                    "policies": [
                        {
                            "custom": {
                                "class": "examples.policies:CurrencyPolicy",
                                "config": {"allowed": "EUR"},
                            }
                        }
                    ],
                }
            ],
            EXAMPLES,
        )


def test_custom_policy_found_beside_the_config(tmp_path: Path) -> None:
    (tmp_path / "my_checks_kvproxy_test.py").write_text(
        textwrap.dedent(
            """
            class Crashy:
                name = "crashy"
                closed = False
                def __init__(self, config):
                    self.config = dict(config)
                @classmethod
                def create(cls, context, options):
                    return cls(options)
                def validate(self, topic, partition, batch):
                    raise ValueError("bug in policy")
                def close(self):
                    type(self).closed = True
            """
        )
    )
    routing = build_routing(
        None,
        [
            {
                "match": "t",
                "default_policies": "drop",
                "policies": [
                    {"custom": {"class": "my_checks_kvproxy_test:Crashy", "config": {"a": 1}}}
                ],
            }
        ],
        tmp_path,
    )
    chain = routing.chain_for("t")
    verdict = chain.check(produced(build_batch(records(1))))
    assert verdict.code == 87 and verdict.policy == "crashy"
    assert verdict.message == "policy crashy failed: ValueError('bug in policy')"
    assert routing.crash_counts() == {"crashy": 1}
    routing.close()
    assert type(chain.policies[0]).closed is True


def test_example_config_builds() -> None:
    import yaml

    config = yaml.safe_load((EXAMPLES / "kvproxy.yaml").read_text())
    assert set(config) >= {"listen", "upstream", "defaults", "topics"}
    routing = build_routing(config["defaults"], config["topics"], EXAMPLES)
    assert routing.chain_for("orders").names[-1] == "json_schema"
    assert routing.chain_for("payments").names[-1] == "currency"
    assert routing.mode_for("logs.app") is Mode.WARN
    assert routing.mode_for("tmp-1") is Mode.OFF
    routing.close()
