"""`kvproxy.policies.plugins`: every policy found by name through the entry-point group or by
`custom: {class: ...}`, created with `create(context, options)`, what it declares on itself
(`needs`, `topic_settings`, `group` and `stages`) read, and its `observe` fed by the proxy."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from kvproxy.policies import plugins
from kvproxy.policies.api import (
    ACCEPT,
    Need,
    PolicyContext,
    PolicyViolation,
    ProducedRecords,
    Stage,
    Verdict,
)
from kvproxy.policies.config import build_routing
from kvproxy.policies.errors import PolicyConfigError
from kvproxy.policies.topic_settings import FIELD_NAMES
from kvproxy.protocol.error_codes import ErrorProfile
from kvproxy.proxy.produce.decision import ProduceSettings
from kvproxy.proxy.produce.engine import ProduceEngine
from tests.harness.engine import TOPIC, batch, broker_answer, decide, observe
from tests.harness.produced import produced

BUILTINS = {
    "acks",
    "avro",
    "batch_integrity",
    "compacted_key",
    "compression",
    "crc",
    "json",
    "json_schema",
    "key_pattern",
    "max_record_bytes",
    "message_format",
    "offsets",
    "producer_state",
    "required_headers",
    "timestamps",
}
HERE = "tests.unit.test_plugins"


class Loud:
    """A third-party policy: refuses values in capitals; counts what the broker answered."""

    OPTIONS: Mapping[str, Any] = {"word": "STOP"}
    needs = frozenset({Need.BROKER_ANSWER})
    created: list[tuple[PolicyContext, Mapping[str, Any]]] = []

    def __init__(self, word: bytes) -> None:
        self.word = word
        self.seen: list[tuple[str, int, int]] = []

    @classmethod
    def create(cls, context: PolicyContext, options: Mapping[str, Any]) -> Loud:
        cls.created.append((context, options))
        return cls(str(options.get("word", "STOP")).encode())

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        if any(self.word in (r.value or b"") for r in batch.records()):
            raise PolicyViolation("too loud")
        return ACCEPT

    def observe(self, topic: str, partition: int, produced: ProducedRecords, code: int) -> None:
        self.seen.append((topic, partition, code))

    def close(self) -> None:
        pass


class Settings:
    """Reads the topic's settings without naming which: it is given every one."""

    name = "settings"
    needs = frozenset({Need.TOPIC_CONFIG})

    @classmethod
    def create(cls, context: PolicyContext, options: Mapping[str, Any]) -> Settings:
        return cls()

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        return ACCEPT

    def close(self) -> None:
        pass


class Deaf(Loud):
    """Says it observes, without an `observe`."""

    observe = None  # type: ignore[assignment]


class Worded(Settings):
    needs = frozenset({"topic_config"})  # type: ignore[assignment]


class Configured:
    """A policy with `configure(config)` and no `create`: not a policy kvproxy can build."""

    name = "configured"

    def configure(self, config: Mapping[str, Any]) -> None:
        pass

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        return ACCEPT

    def close(self) -> None:
        pass


class Between(Settings):
    """Joins the broker checks' group by declaration, its check between the CRC (20) and the
    batch's fields (30); reads one topic setting unless its `limit` option stands for it."""

    name = "between"
    OPTIONS: Mapping[str, Any] = {"limit": None}
    topic_settings = frozenset({"max_message_bytes"})
    setting_options = {"limit": "max_message_bytes"}
    group = "broker_checks"
    stages = (Stage(25),)

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = dict(options)
        self.explicit = frozenset(options)

    @classmethod
    def create(cls, context: PolicyContext, options: Mapping[str, Any]) -> Between:
        return cls(options)

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        return Verdict(99, "between")


TARGETS = {
    **plugins.entry_point_targets(),
    "loud": f"{HERE}:Loud",
    "settings": f"{HERE}:Settings",
    "deaf": f"{HERE}:Deaf",
    "worded": f"{HERE}:Worded",
    "between": f"{HERE}:Between",
    "broken": "no_such_module_here:Policy",
}


def routing(*policies: Any, **rule: Any) -> Any:
    return build_routing(
        None,
        [{"match": TOPIC, "default_policies": "drop", "policies": list(policies), **rule}],
        Path("."),
        policy_targets=TARGETS,
    )


def problem(*policies: Any) -> str:
    with pytest.raises(PolicyConfigError) as caught:
        routing(*policies)
    return str(caught.value)


# ---- discovery ----


def test_every_builtin_is_an_entry_point_of_kvproxy() -> None:
    assert set(plugins.policy_names()) >= BUILTINS
    targets = plugins.entry_point_targets()
    assert targets["crc"] == "kvproxy.policies.builtin.broker:CrcPolicy"
    assert all(targets[name].startswith("kvproxy.policies.builtin.") for name in BUILTINS)
    assert plugins.find_factory("crc").name == "crc"
    assert plugins.find_factory("no_such_policy") is None


def test_the_targets_shipped_to_executors_include_what_was_installed_since_the_last_scan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plugins, "_found", {})  # a scan from before anything was installed
    assert plugins.entry_point_targets()["crc"] == "kvproxy.policies.builtin.broker:CrcPolicy"


def test_missing_metadata_of_kvproxy_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(name: str) -> Any:
        raise plugins.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(plugins, "_found", None)
    monkeypatch.setattr(plugins.metadata, "distribution", absent)
    with pytest.raises(PolicyConfigError, match="reinstall kvproxy"):
        build_routing({"policies": ["crc"]}, None, Path("."))
    monkeypatch.setattr(plugins, "_found", None)  # scanned again with the metadata back


def test_unknown_names_keep_their_words() -> None:
    assert problem("jsn") == "topics[0].policies[0]: unknown policy 'jsn' (did you mean 'json'?)"
    assert problem({"loud": {"wrd": "x"}}) == (
        "topics[0].policies[0]: policy loud: unknown option 'wrd' (did you mean 'word'?)"
    )


# ---- create ----


def test_a_plugin_is_created_with_the_context_and_its_options() -> None:
    Loud.created.clear()
    chain = routing("crc", {"loud": {"word": "HALT"}}).chain_for(TOPIC)
    ((context, options),) = Loud.created
    assert isinstance(context, PolicyContext) and options == {"word": "HALT"}
    assert chain.names == ("crc", "loud")  # named after its entry point when it has no name


def test_a_plugin_that_cannot_be_loaded_or_is_misshapen_is_reported() -> None:
    assert problem("broken").startswith(
        "topics[0].policies[0]: policy broken: cannot load no_such_module_here:Policy: "
    )
    assert problem("deaf") == (
        "topics[0].policies[0]: policy deaf: needs BROKER_ANSWER but has no observe() method"
    )
    assert problem("worded") == (
        "topics[0].policies[0]: policy worded: needs must hold policies.api.Need members, "
        "not frozenset({'topic_config'})"
    )


def test_a_custom_class_is_built_by_create_as_every_policy() -> None:
    Loud.created.clear()
    chain = routing({"custom": {"class": f"{HERE}:Loud", "config": {"word": "HALT"}}})
    ((context, options),) = Loud.created
    assert isinstance(context, PolicyContext) and options == {"word": "HALT"}
    assert chain.chain_for(TOPIC).names == ("Loud",)  # the class's name when it has none
    assert problem({"custom": {"class": f"{HERE}:Loud", "config": {"wrd": 1}}}) == (
        f"topics[0].policies[0]: custom {HERE}:Loud: unknown option 'wrd' (did you mean 'word'?)"
    )
    assert problem({"custom": {"class": f"{HERE}:Configured"}}) == (
        f"topics[0].policies[0]: custom {HERE}:Configured: has no create(context, options)"
    )


# ---- declarations ----


def test_a_policy_joins_a_group_at_the_place_its_stages_declare() -> None:
    """The chain groups by what a policy declares, not by its name or module: `between` runs
    after the CRC and before the batch's fields, wherever it is listed."""
    broken = bytearray(batch(b"x"))
    broken[-1] ^= 0xFF  # the CRC no longer matches
    chain = routing("between", "batch_integrity", "crc").chain_for(TOPIC)
    assert chain.check(produced(bytes(broken), topic=TOPIC)).policy == "crc"
    assert chain.check(produced(batch(b"x"), topic=TOPIC)).policy == "between"


def test_topic_settings_read_are_those_the_policy_declares() -> None:
    assert routing("between").settings_needed(TOPIC) == {"max_message_bytes"}
    assert routing({"between": {"limit": 5}}).settings_needed(TOPIC) == frozenset()


# ---- needs ----


def test_the_chain_needs_what_its_policies_declare() -> None:
    assert routing("crc", "json").chain_for(TOPIC).needs == frozenset()
    keyed = routing("crc", "compacted_key", "loud")
    assert keyed.chain_for(TOPIC).needs == {Need.TOPIC_CONFIG, Need.BROKER_ANSWER}
    assert keyed.settings_needed(TOPIC) == {"compacted"}
    assert routing("settings").settings_needed(TOPIC) == set(FIELD_NAMES)
    assert routing("loud", mode="off").chain_for(TOPIC).needs == frozenset()
    state = routing("producer_state").chain_for(TOPIC)
    assert state.needs == {Need.PRODUCER_STATE, Need.BROKER_ANSWER}
    assert [p.name for p in state.observers] == ["producer_state"]


# ---- observe ----


def engine_with(*policies: Any) -> ProduceEngine:
    return ProduceEngine(
        routing(*policies), ProduceSettings(profile=ErrorProfile.KAFKA), lambda _: False
    )


def test_observe_sees_the_broker_answer_to_what_the_chain_let_through() -> None:
    chosen = engine_with("crc", "loud")
    decision = decide(chosen, 9, [(TOPIC, 0, batch(b"STOP it")), (TOPIC, 1, batch(b"calm"))])
    (loud,) = [p for p in chosen.routing.chain_for(TOPIC).policies if p.name == "loud"]
    observe(decision, broker_answer(9, [1]))
    assert loud.seen == [(TOPIC, 1, 0)]  # the refused partition was never the broker's


def test_no_observer_no_decoding_of_the_answer() -> None:
    decision = decide(engine_with("crc"), 9, [(TOPIC, 0, batch(b"x"))])
    assert decision.observing == ()
    observe(decision, b"not a produce answer")  # never decoded: nothing observes it


def test_an_observer_that_raises_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    chosen = engine_with("loud")
    decision = decide(chosen, 9, [(TOPIC, 0, batch(b"calm"))])
    (loud,) = chosen.routing.chain_for(TOPIC).policies

    def fail(*_: Any) -> None:
        raise RuntimeError("observer down")

    loud.observe = fail
    observe(decision, broker_answer(9, [0]))
    assert "policy loud failed to observe the broker's answer" in caplog.text


def test_producer_state_leaves_a_plain_producers_answer_undecoded() -> None:
    """`producer_state` declines (`wants_answer`) batches without a producer id: a chain with it
    costs a plain producer no decoding of the broker's answer."""
    decision = decide(engine_with("producer_state"), 9, [(TOPIC, 0, batch(b"plain"))])
    assert decision.observing  # the chain observes ...
    observe(decision, b"not a produce answer")  # ... but nothing here is an idempotent batch


def test_the_producer_state_is_handed_only_to_a_policy_that_declares_it() -> None:
    Loud.created.clear()
    built = routing("producer_state", "loud")
    ((context, _),) = Loud.created
    assert context.producer_state is None  # Loud needs the broker's answer, not the tracker
    (state,) = [p for p in built.chain_for(TOPIC).policies if p.name == "producer_state"]
    assert state.tracker is built.producer_state  # declared: the routing's own, kept on reload


def test_a_failed_observe_does_not_silence_the_next_crash_of_validate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chosen = engine_with("loud")
    decision = decide(chosen, 9, [(TOPIC, 0, batch(b"calm"))])
    (loud,) = chosen.routing.chain_for(TOPIC).policies

    def fail(*_: Any) -> None:
        raise RuntimeError("down")

    loud.observe = fail
    observe(decision, broker_answer(9, [0]))
    loud.validate = fail
    decide(chosen, 9, [(TOPIC, 0, batch(b"calm"))])
    assert "policy loud failed to observe the broker's answer" in caplog.text
    assert "policy loud failed (1 failures so far); rejecting the partition" in caplog.text
