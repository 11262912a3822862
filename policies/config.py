"""The YAML `defaults` / `topics` sections -> one `PolicyChain` per rule, and topic routing.

```yaml
defaults: {mode: enforce, policies: [batch_integrity, crc, timestamps, compacted_key]}
topics:
  - match: orders                 # exact name, glob (orders.*) or /regex/ (fullmatch)
    compacted: true
    policies: [crc, {max_record_bytes: {limit: 1048576}}]
  - match: "logs.*"
    mode: warn                     # policies inherited from defaults
  - match: payments
    policies: [{custom: {class: "examples.policies:CurrencyPolicy", config: {allowed: [EUR]}}}]
```
First match wins; `defaults` covers the rest. Every problem is a `PolicyConfigError` naming the
entry and the policy.
"""

from __future__ import annotations

import fnmatch
import importlib
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.api import RecordsPolicy
from policies.builtin import REGISTRY, PolicyConfigError, PolicyContext
from policies.chain import Mode, PolicyChain
from policies.producer_state import ProducerStateTracker

__all__ = [
    "DEFAULT_DEFAULTS",
    "PolicyConfigError",
    "TopicRouting",
    "TopicRule",
    "build_routing",
    "load_custom_class",
]

DEFAULT_POLICIES: tuple[str, ...] = ("batch_integrity", "crc", "timestamps", "compacted_key")
DEFAULT_DEFAULTS: Mapping[str, Any] = {"mode": "enforce", "policies": list(DEFAULT_POLICIES)}

_DEFAULTS_KEYS = frozenset({"mode", "policies"})
_TOPIC_KEYS = frozenset({"match", "mode", "compacted", "policies"})
_CUSTOM_KEYS = frozenset({"class", "config"})
_CACHE_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class TopicRule:
    """One `topics` entry (or the defaults), resolved."""

    match: str | None
    """The pattern as written; None for the defaults."""
    mode: Mode
    compacted: bool | None
    chain: PolicyChain
    matcher: Callable[[str], bool]

    @property
    def policy_names(self) -> tuple[str, ...]:
        return self.chain.names


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
        """The tracker every `producer_state` policy reads; the proxy feeds it."""
        self._cache: dict[str, TopicRule] = {}

    def rule_for(self, topic: str) -> TopicRule:
        rule = self._cache.get(topic)
        if rule is None:
            rule = next((r for r in self.rules if r.matcher(topic)), self.default)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[topic] = rule
        return rule

    def chain_for(self, topic: str) -> PolicyChain:
        return self.rule_for(topic).chain

    def mode_for(self, topic: str) -> Mode:
        return self.rule_for(topic).mode

    def compacted_override(self, topic: str) -> bool | None:
        return self.rule_for(topic).compacted

    def all_rules(self) -> Iterator[TopicRule]:
        yield from self.rules
        yield self.default

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


def build_routing(
    defaults: Mapping[str, Any] | None,
    topics: Sequence[Mapping[str, Any]] | None,
    base_dir: Path,
    *,
    producer_state: ProducerStateTracker | None = None,
) -> TopicRouting:
    """Resolve the config sections; pass the old routing's `producer_state` on reload to keep it.

    Policies already built are closed again when a later entry fails.
    """
    context = PolicyContext(base_dir=Path(base_dir), producer_state=producer_state)
    built: list[TopicRule] = []
    try:
        default = _build_defaults(defaults, context)
        built.append(default)
        if topics is not None and not isinstance(topics, Sequence | list):
            raise PolicyConfigError("topics must be a list of entries")
        rules: list[TopicRule] = []
        for position, entry in enumerate(topics or ()):
            rule = _build_topic(position, entry, default, defaults, context)
            built.append(rule)
            rules.append(rule)
    except BaseException:
        for rule in built:
            rule.chain.close()
        raise
    tracker = context.producer_state  # not `or`: an empty tracker is falsy (it has __len__)
    if tracker is None:
        tracker = ProducerStateTracker()
    return TopicRouting(rules, default, tracker)


def _build_defaults(defaults: Mapping[str, Any] | None, context: PolicyContext) -> TopicRule:
    where = "defaults"
    if defaults is None:
        defaults = DEFAULT_DEFAULTS
    if not isinstance(defaults, Mapping):
        raise PolicyConfigError(f"{where}: must be a mapping")
    _check_keys(where, defaults, _DEFAULTS_KEYS)
    mode = _mode(where, defaults.get("mode", "enforce"))
    specs = defaults.get("policies", list(DEFAULT_POLICIES))
    policies = _build_policies(where, specs, context)
    return TopicRule(None, mode, None, PolicyChain(policies, mode), lambda _topic: True)


def _build_topic(
    position: int,
    entry: Mapping[str, Any],
    default: TopicRule,
    defaults: Mapping[str, Any] | None,
    context: PolicyContext,
) -> TopicRule:
    if not isinstance(entry, Mapping):
        raise PolicyConfigError(f"topics[{position}]: must be a mapping with a match key")
    pattern = entry.get("match")
    where = f"topics[{position}] (match {pattern!r})"
    if not isinstance(pattern, str) or not pattern:
        raise PolicyConfigError(f"{where}: match must be a non-empty string")
    _check_keys(where, entry, _TOPIC_KEYS)
    matcher = _matcher(where, pattern)
    mode = _mode(where, entry["mode"]) if "mode" in entry else default.mode
    compacted = entry.get("compacted")
    if compacted is not None and not isinstance(compacted, bool):
        raise PolicyConfigError(f"{where}: compacted must be true, false or absent")
    if "policies" in entry:
        specs = entry["policies"]
    else:
        source = DEFAULT_DEFAULTS if defaults is None else defaults
        specs = source.get("policies", list(DEFAULT_POLICIES))
    policies = _build_policies(where, specs, context)
    return TopicRule(pattern, mode, compacted, PolicyChain(policies, mode), matcher)


def _check_keys(where: str, section: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(str(k) for k in set(section) - allowed)
    if unknown:
        raise PolicyConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(allowed))})"
        )


def _mode(where: str, value: Any) -> Mode:
    if value is False:
        return Mode.OFF  # YAML 1.1 (PyYAML) reads a bare `off` as false
    try:
        return Mode(value)
    except ValueError:
        known = ", ".join(m.value for m in Mode)
        raise PolicyConfigError(f"{where}: mode must be one of {known}, not {value!r}") from None


def _matcher(where: str, pattern: str) -> Callable[[str], bool]:
    if len(pattern) >= 2 and pattern.startswith("/") and pattern.endswith("/"):
        try:
            regex = re.compile(pattern[1:-1])
        except re.error as exc:
            raise PolicyConfigError(f"{where}: bad regular expression: {exc}") from None
        return lambda topic: regex.fullmatch(topic) is not None
    if any(ch in pattern for ch in "*?["):
        regex = re.compile(fnmatch.translate(pattern))
        return lambda topic: regex.match(topic) is not None
    return lambda topic: topic == pattern


def _build_policies(where: str, specs: Any, context: PolicyContext) -> list[RecordsPolicy]:
    if not isinstance(specs, list | tuple):
        raise PolicyConfigError(f"{where}: policies must be a list")
    policies: list[RecordsPolicy] = []
    try:
        for spec in specs:
            policies.append(_build_policy(where, spec, context))
    except BaseException:
        for policy in policies:
            policy.close()
        raise
    return policies


def _build_policy(where: str, spec: Any, context: PolicyContext) -> RecordsPolicy:
    if isinstance(spec, str):
        name, options = spec, None
    elif isinstance(spec, Mapping) and len(spec) == 1:
        ((name, options),) = spec.items()
    else:
        raise PolicyConfigError(
            f"{where}: a policy is a name or a one-key mapping {{name: {{options}}}}, not {spec!r}"
        )
    if name == "custom":
        return _build_custom(where, options, context)
    cls = REGISTRY.get(name)
    if cls is None:
        known = ", ".join([*sorted(REGISTRY), "custom"])
        raise PolicyConfigError(f"{where}: unknown policy {name!r} (known: {known})")
    if options is not None and not isinstance(options, Mapping):
        raise PolicyConfigError(f"{where}: policy {name}: options must be a mapping")
    try:
        policy = cls(context)
        policy.configure(options or {})
    except PolicyConfigError as exc:
        raise PolicyConfigError(f"{where}: {exc}") from None
    return policy


def _build_custom(where: str, options: Any, context: PolicyContext) -> RecordsPolicy:
    if not isinstance(options, Mapping):
        raise PolicyConfigError(f"{where}: custom needs {{class: 'module:Class', config: {{}}}}")
    _check_keys(f"{where}: custom", options, _CUSTOM_KEYS)
    target = options.get("class")
    if not isinstance(target, str):
        raise PolicyConfigError(f"{where}: custom: class must be 'module:Class'")
    config = options.get("config") or {}
    if not isinstance(config, Mapping):
        raise PolicyConfigError(f"{where}: custom {target}: config must be a mapping")
    try:
        cls = load_custom_class(target, context.base_dir)
    except PolicyConfigError as exc:
        raise PolicyConfigError(f"{where}: {exc}") from None
    try:
        policy = cls()
        if not getattr(policy, "name", None):
            policy.name = cls.__name__
        policy.configure(config)
    except Exception as exc:
        raise PolicyConfigError(f"{where}: custom {target}: configure failed: {exc!r}") from exc
    for method in ("configure", "validate", "close"):
        if not callable(getattr(policy, method, None)):
            raise PolicyConfigError(f"{where}: custom {target}: has no {method}() method")
    return policy  # type: ignore[no-any-return]


def load_custom_class(target: str, base_dir: Path) -> Any:
    """Import `module:Class`; when the module is not importable as is, retry from `base_dir`
    and its parent (so `examples.policies:X` works beside `examples/kvproxy.yaml`)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise PolicyConfigError(f"custom class {target!r} must be written 'module:Class'")
    try:
        module = _import(module_name, base_dir)
    except Exception as exc:
        raise PolicyConfigError(
            f"custom class {target}: cannot import {module_name}: {exc}"
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise PolicyConfigError(f"custom class {target}: {module_name} has no {attr}")
    if not callable(obj):
        raise PolicyConfigError(f"custom class {target}: {attr} is not a class")
    return obj


def _import(module_name: str, base_dir: Path) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.split(".", maxsplit=1)[0]
        if exc.name not in (top, module_name):
            raise
        first_error = exc
    for folder in (Path(base_dir).resolve(), Path(base_dir).resolve().parent):
        entry = str(folder)
        if entry in sys.path:
            continue
        sys.path.insert(0, entry)
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            sys.path.remove(entry)
            if exc.name not in (top, module_name):
                raise
    raise first_error
