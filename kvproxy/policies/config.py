"""The YAML `defaults` / `topics` sections -> one `PolicyChain` per rule, and topic routing.

```yaml
defaults: {mode: enforce, policies: [batch_integrity, crc, timestamps, compacted_key]}
topics:
  - match: orders                 # exact name, glob (orders.*) or /regex/ (fullmatch)
    compacted: true
    config: {message.timestamp.type: LogAppendTime, max.message.bytes: 2097152}
    policies: [{max_record_bytes: {limit: 1048576}}]   # added to the defaults' policies
  - match: "logs.*"
    mode: warn                     # policies inherited from defaults
  - match: payments
    default_policies: drop         # only the policies listed here
    policies: [crc, {custom: {class: "examples.policies:CurrencyPolicy", config: {allowed: [EUR]}}}]
```
First match wins; `defaults` covers the rest. An entry's `policies` are added to the defaults'
(a policy named in both runs with the entry's options) unless it says `default_policies: drop`:
a check a broker makes is dropped only where the file says so.

What is wrong with the sections is reported all at once: one `PolicyConfigError` whose
`problems` say where and why, e.g.
`topics[0].policies[1]: unknown policy 'jsn' (did you mean 'json'?)`.
"""

from __future__ import annotations

import difflib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvproxy.policies import plugins, topic_settings
from kvproxy.policies.api import (
    UNKNOWN_TOPIC_CONFIG,
    Need,
    PolicyContext,
    RecordsPolicy,
    TopicConfig,
)
from kvproxy.policies.chain import Mode, PolicyChain
from kvproxy.policies.errors import (
    MAX_PROBLEMS_SHOWN,
    ConfigProblem,
    KeyPath,
    PolicyConfigError,
    kind_of,
    short_repr,
)
from kvproxy.policies.producer_state import ProducerStateTracker
from kvproxy.policies.topic_names import NoSuchTopicPolicy
from kvproxy.policies.topic_patterns import FirstMatch, PatternError, compile_pattern
from kvproxy.protocol.topics import is_legal_topic_name

__all__ = [
    "MAX_TOPIC_RULES",
    "TopicRouting",
    "TopicRule",
    "build_routing",
    "spelling_hint",
]


_DEFAULTS_KEYS = frozenset({"mode", "policies"})
_TOPIC_KEYS = frozenset({"match", "mode", "compacted", "config", "policies", "default_policies"})
_DEFAULT_POLICIES_VALUES = ("keep", "drop")
"""`default_policies:` of a topic entry: the defaults' policies run too (keep, the default), or
only the entry's own (drop)."""
_CACHE_LIMIT = 10_000
"""Topics whose rule `TopicRouting` remembers, the least recently used dropped first. A name that
cannot be a topic (`kvproxy.protocol.topics`) is never matched nor kept: clients choose names."""
MAX_TOPIC_RULES = 10_000
"""Entries `topics` may hold: a rule set past it (YAML aliases make one easily) is refused.
Each rule builds its policies when the file is loaded, and a new topic name is matched against
the patterns of all of them (`FirstMatch`: a few RE2 expressions, each linear in the name)."""


@dataclass(frozen=True, slots=True)
class TopicRule:
    """One `topics` entry (or the defaults), resolved."""

    match: str | None
    """The pattern as written; None for the defaults."""
    mode: Mode
    compacted: bool | None
    """`compacted:`, or what `config: {cleanup.policy: ...}` says; None: the cluster's."""
    chain: PolicyChain
    matcher: Callable[[str], bool]
    config: TopicConfig = UNKNOWN_TOPIC_CONFIG
    """The topic settings the entry sets (`config:`, `compacted:`), over the cluster's."""
    needs: frozenset[str] = frozenset()
    """The `TopicConfig` fields its policies read and `config` leaves unknown: what the proxy
    asks the cluster for (nothing when the mode is off)."""
    dropped_defaults: tuple[str, ...] | None = None
    """The defaults' policies an entry with `default_policies: drop` does not run; None when the
    defaults' policies run (or for the defaults themselves)."""

    @property
    def policy_names(self) -> tuple[str, ...]:
        return self.chain.names

    @property
    def defaults_summary(self) -> str:
        """Whether the defaults' policies run under this rule, as `kvproxy check` says it (nothing
        for the defaults themselves, nor for a rule whose mode is off: it runs nothing)."""
        if self.match is None or self.mode is Mode.OFF:
            return ""
        if self.dropped_defaults is None:
            return "default policies kept"
        dropped = ", ".join(self.dropped_defaults) or "none, the entry lists them all"
        return f"default policies dropped (default_policies: drop): {dropped}"


class TopicRouting:
    """Which rule (chain, mode, compaction override) applies to a topic."""

    def __init__(
        self,
        rules: Sequence[TopicRule],
        default: TopicRule,
        producer_state: ProducerStateTracker,
    ) -> None:
        self.rules = tuple(rules)
        self.default = default
        self.producer_state = producer_state
        """The tracker every `producer_state` policy reads and feeds (`observe`)."""
        self.no_such_topic = TopicRule(
            None, Mode.ENFORCE, None, PolicyChain([NoSuchTopicPolicy()]), lambda _topic: False
        )
        """The rule of a name that cannot be a topic (`kvproxy.policies.topic_names`)."""
        self._first_match = FirstMatch([rule.match or "" for rule in self.rules])
        self._cache: OrderedDict[str, TopicRule] = OrderedDict()

    @property
    def cached_topics(self) -> int:
        """Topics whose rule is remembered (at most `_CACHE_LIMIT`)."""
        return len(self._cache)

    def rule_for(self, topic: str) -> TopicRule:
        rule = self._cache.get(topic)
        if rule is not None:
            self._cache.move_to_end(topic)
            return rule
        if not is_legal_topic_name(topic):
            return self.no_such_topic
        index = self._first_match.index(topic)
        rule = self.default if index is None else self.rules[index]
        self._cache[topic] = rule
        if len(self._cache) > _CACHE_LIMIT:
            self._cache.popitem(last=False)
        return rule

    def chain_for(self, topic: str) -> PolicyChain:
        return self.rule_for(topic).chain

    def mode_for(self, topic: str) -> Mode:
        return self.rule_for(topic).mode

    def compacted_override(self, topic: str) -> bool | None:
        return self.rule_for(topic).compacted

    def config_override(self, topic: str) -> TopicConfig:
        """The settings the YAML gives `topic` (None where the cluster's are to be used)."""
        return self.rule_for(topic).config

    def settings_needed(self, topic: str) -> frozenset[str]:
        """The `TopicConfig` fields `topic`'s checks read that the YAML does not give."""
        return self.rule_for(topic).needs

    def all_rules(self) -> Iterator[TopicRule]:
        """The configured rules and the defaults (not `no_such_topic`, which is fixed)."""
        yield from self.rules
        yield self.default

    def rules_needing(self, need: Need) -> list[TopicRule]:
        """The rules with a policy that declares `need` (`Need.SCHEMAS`: a registry is needed)."""
        return [rule for rule in self.all_rules() if need in rule.chain.needs]

    def crash_counts(self) -> dict[str, int]:
        """Crashes per policy name, summed over every rule's chain."""
        out: dict[str, int] = {}
        for rule in self.all_rules():
            for name, count in rule.chain.crash_counts.items():
                out[name] = out.get(name, 0) + count
        return out

    def close(self) -> None:
        for rule in self.all_rules():
            rule.chain.close()
        self.no_such_topic.chain.close()


def build_routing(
    defaults: Mapping[str, Any] | None,
    topics: Sequence[Mapping[str, Any]] | None,
    base_dir: Path,
    *,
    producer_state: ProducerStateTracker | None = None,
    policy_targets: Mapping[str, str] | None = None,
    default_policies: Sequence[str] | None = None,
) -> TopicRouting:
    """Resolve the config sections; pass the old routing's `producer_state` on reload to keep it.
    `policy_targets` (`plugins.entry_point_targets`) names the policies where the installed
    entry points are not to be scanned, and `default_policies` (`plugins.default_policies`)
    then the chain of defaults that name none.

    Every problem of both sections is found before one `PolicyConfigError` lists them all, so a
    file is fixed in one round; the policies built meanwhile are closed again.
    """
    context = PolicyContext(base_dir=Path(base_dir), producer_state=producer_state)
    problems = _Problems()
    built: list[TopicRule] = []
    try:
        default, default_specs = _build_defaults(
            defaults, context, problems, policy_targets, default_policies
        )
        built.append(default)
        rules: list[TopicRule] = []
        for position, entry in enumerate(_entries(topics, problems)):
            rule = _build_topic(
                position,
                entry,
                default,
                default_specs,
                context=context,
                problems=problems,
                targets=policy_targets,
            )
            if rule is not None:
                built.append(rule)
                rules.append(rule)
        if problems.found:
            raise PolicyConfigError(problems=problems.found)
        try:
            routing = TopicRouting(rules, default, _tracker(context))
        except PatternError as exc:  # each pattern compiled alone: only all of them together
            raise PolicyConfigError(problems=[ConfigProblem((), str(exc), ("topics",))]) from None
    except BaseException:
        for rule in built:
            rule.chain.close()
        raise
    return routing


def _tracker(context: PolicyContext) -> ProducerStateTracker:
    tracker = context.producer_state  # not `or`: an empty tracker is falsy (it has __len__)
    return ProducerStateTracker() if tracker is None else tracker


def spelling_hint(key: object, known: Iterable[str]) -> str:
    """What a misspelt key was probably meant to be, or else the keys that are known."""
    names = sorted(known)
    close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    return f"known: {', '.join(names) or 'none'}"


class _Problems:
    """The problems found so far, each once: a topic that inherits the defaults' policies builds
    them again and would repeat the defaults' problems."""

    def __init__(self) -> None:
        self.found: list[ConfigProblem] = []
        self._seen: set[ConfigProblem] = set()  # a list's `in` made many problems quadratic

    def add(self, path: KeyPath, message: str, at: KeyPath = ()) -> None:
        problem = ConfigProblem(path, message, at)
        if problem not in self._seen:
            self._seen.add(problem)
            self.found.append(problem)

    def hint(self, key: object, known: Iterable[str]) -> str:
        """` (did you mean ...?)` for a misspelt key, while the report still lists problems."""
        if len(self.found) >= MAX_PROBLEMS_SHOWN:
            return ""
        return f" ({spelling_hint(key, known)})"


def _entries(topics: Any, problems: _Problems) -> Sequence[Any]:
    if topics is None:
        return ()
    if isinstance(topics, str | bytes) or not isinstance(topics, Sequence):
        problems.add((), f"topics must be a list, not {kind_of(topics)}", ("topics",))
        return ()
    if len(topics) > MAX_TOPIC_RULES:
        problems.add(
            (),
            f"topics has {len(topics):,} rules, more than the {MAX_TOPIC_RULES:,} allowed "
            "(YAML aliases repeat entries: write one rule per pattern, or use globs and /regex/)",
            ("topics",),
        )
        return ()
    return topics


def _build_defaults(
    defaults: Mapping[str, Any] | None,
    context: PolicyContext,
    problems: _Problems,
    targets: Mapping[str, str] | None,
    default_policies: Sequence[str] | None,
) -> tuple[TopicRule, Any]:
    """The rule of every other topic, and the policies it names (which topics without a
    `policies` key inherit; the installed default chain when it names none)."""
    where: KeyPath = ("defaults",)
    if defaults is None:
        defaults = {}
    if not isinstance(defaults, Mapping):
        problems.add((), f"defaults must be a mapping, not {kind_of(defaults)}", where)
        defaults = {}
    _check_keys(where, defaults, _DEFAULTS_KEYS, problems)
    mode = _mode(where, defaults.get("mode", "enforce"), problems) or Mode.ENFORCE
    specs = defaults.get("policies")
    if specs is None:
        specs = list(plugins.default_policies() if default_policies is None else default_policies)
    policies = _build_policies(where, specs, context, problems, targets)
    chain = PolicyChain(policies, mode)
    rule = TopicRule(None, mode, None, chain, lambda _topic: True, needs=_needs(chain))
    return rule, specs


def _build_topic(
    position: int,
    entry: Any,
    default: TopicRule,
    default_specs: Any,
    *,
    context: PolicyContext,
    problems: _Problems,
    targets: Mapping[str, str] | None,
) -> TopicRule | None:
    """The entry's rule; None when the entry has a problem (then reported in `problems`)."""
    where: KeyPath = ("topics", position)
    if not isinstance(entry, Mapping):
        problems.add(where, f"must be a mapping, not {kind_of(entry)}")
        return None
    before = len(problems.found)
    _check_keys(where, entry, _TOPIC_KEYS, problems)
    pattern = entry.get("match")
    matcher = None
    if "match" not in entry:
        problems.add(where, "match is missing")
    elif not isinstance(pattern, str) or not pattern:
        problems.add(where, f"match must be a non-empty string, not {kind_of(pattern)}", ("match",))
    else:
        matcher = _matcher(where, pattern, problems)
    mode = _mode(where, entry["mode"], problems) if "mode" in entry else default.mode
    compacted = entry.get("compacted")
    if compacted is not None and not isinstance(compacted, bool):
        problems.add(
            where,
            f"compacted must be true, false or absent, not {short_repr(compacted)}",
            ("compacted",),
        )
    config = _topic_config(where, entry.get("config"), problems)
    if config.compacted is not None:
        if compacted is not None:
            problems.add(
                where,
                f"compacted and config.{topic_settings.CLEANUP_POLICY} both say whether the "
                "topic is compacted: keep one",
                ("compacted",),
            )
        compacted = config.compacted
    elif isinstance(compacted, bool):
        config = TopicConfig(compacted=compacted).over(config)
    keep = _keeps_defaults(where, entry.get("default_policies", "keep"), problems)
    own = _build_policies(where, entry.get("policies", []), context, problems, targets)
    # the defaults' problems, if any, are reported where the defaults name them
    inherited = _build_policies(("defaults",), default_specs, context, problems, targets)
    policies, dropped = _merge(inherited, own, keep=keep)
    if matcher is None or mode is None or keep is None or len(problems.found) > before:
        for policy in policies:
            policy.close()
        return None
    chain = PolicyChain(policies, mode)
    needs = _needs(chain, config)
    return TopicRule(pattern, mode, compacted, chain, matcher, config, needs, dropped)


def _keeps_defaults(where: KeyPath, value: Any, problems: _Problems) -> bool | None:
    """`default_policies:`: True for keep, False for drop, None when it is neither."""
    if value in _DEFAULT_POLICIES_VALUES:
        return bool(value == "keep")
    wrong = f"default_policies must be keep or drop, not {short_repr(value)}"
    problems.add(where, wrong, ("default_policies",))
    return None


def _merge(
    inherited: list[RecordsPolicy], own: list[RecordsPolicy], *, keep: bool | None
) -> tuple[list[RecordsPolicy], tuple[str, ...] | None]:
    """A topic's policies: the defaults', each one the entry names again replaced in its place by
    the entry's (whose options win), then the entry's others; with `keep` false, the entry's only.
    Also the names of the defaults' policies `default_policies: drop` leaves out (None when they
    are kept). The defaults' policies not used are closed."""
    named = {policy.name: policy for policy in reversed(own)}  # the first of a name
    if keep is False:
        for policy in inherited:
            policy.close()
        return own, tuple(dict.fromkeys(p.name for p in inherited if p.name not in named))
    merged: list[RecordsPolicy] = []
    placed: set[int] = set()
    for default in inherited:
        replacement = named.get(default.name)
        if replacement is not None:
            default.close()
        policy = default if replacement is None else replacement
        if id(policy) not in placed:
            placed.add(id(policy))
            merged.append(policy)
    return [*merged, *(p for p in own if id(p) not in placed)], None


def _topic_config(where: KeyPath, section: Any, problems: _Problems) -> TopicConfig:
    """A topic entry's `config:` (Kafka's topic setting names), each wrong value reported."""
    if section is None:
        return UNKNOWN_TOPIC_CONFIG
    if not isinstance(section, Mapping):
        problems.add(where, f"config must be a mapping, not {kind_of(section)}", ("config",))
        return UNKNOWN_TOPIC_CONFIG
    here: KeyPath = (*where, "config")

    def report(key: object, message: str) -> None:
        name = key if isinstance(key, str | int) else short_repr(key)
        if message == "unknown setting":
            hint = problems.hint(key, topic_settings.SETTING_NAMES)
            problems.add((*here, name), f"unknown topic setting{hint}")
        else:
            problems.add(here, f"{name} {message}, not {short_repr(section[key])}", (name,))

    return topic_settings.from_yaml(section, report)


def _needs(chain: PolicyChain, config: TopicConfig = UNKNOWN_TOPIC_CONFIG) -> frozenset[str]:
    """The `TopicConfig` fields the chain's policies read and `config` does not give."""
    read: set[str] = set()
    if Need.TOPIC_CONFIG not in chain.needs:  # no policy declares it (or the mode is off)
        return frozenset()
    for declared in chain.declarations:
        read |= declared.settings_read
    return frozenset(name for name in read if getattr(config, name, None) is None)


def _check_keys(
    where: KeyPath, section: Mapping[Any, Any], allowed: frozenset[str], problems: _Problems
) -> None:
    for key in section:
        if key not in allowed:
            problems.add((*where, key), f"unknown key{problems.hint(key, allowed)}")


def _mode(where: KeyPath, value: Any, problems: _Problems) -> Mode | None:
    if value is False:
        return Mode.OFF  # YAML 1.1 (PyYAML) reads a bare `off` as false
    try:
        if isinstance(value, str):  # Enum's own error would repr any value in full
            return Mode(value)
    except ValueError:
        pass
    known = ", ".join(m.value for m in Mode)
    problems.add(where, f"mode must be one of {known}, not {short_repr(value)}", ("mode",))
    return None


def _matcher(where: KeyPath, pattern: str, problems: _Problems) -> Callable[[str], bool] | None:
    try:
        return compile_pattern(pattern)
    except PatternError as exc:
        problems.add(where, f"match {exc}", ("match",))
        return None


def _build_policies(
    where: KeyPath,
    specs: Any,
    context: PolicyContext,
    problems: _Problems,
    targets: Mapping[str, str] | None,
) -> list[RecordsPolicy]:
    """The policies of `specs` that build; the others are reported in `problems`."""
    if not isinstance(specs, list | tuple):
        problems.add(where, f"policies must be a list, not {kind_of(specs)}", ("policies",))
        return []
    policies: list[RecordsPolicy] = []
    try:
        for index, spec in enumerate(specs):
            at = (*where, "policies", index)
            policy = plugins.build_policy(at, spec, context, problems, targets)
            if policy is not None:
                policies.append(policy)
    except BaseException:
        for policy in policies:
            policy.close()
        raise
    return policies
