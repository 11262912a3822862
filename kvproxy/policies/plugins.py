"""Policies by the name the YAML gives them: the built-ins and other distributions' alike.

Every name is an entry point of the group `kvproxy.policies` (kvproxy's own in its
pyproject.toml); `custom: {class: "module:Class", config: {...}}` names an object by its import
path instead. Either way the object has `create(context, options)`, which returns the configured
policy (the contract: `kvproxy.policies.api.RecordsPolicy`). See docs/adding-a-policy.md.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from kvproxy.policies.api import Need, PolicyContext, RecordsPolicy
from kvproxy.policies.declaration import declaration_problem, needs_of
from kvproxy.policies.errors import KeyPath, PolicyConfigError, cut, kind_of, short_repr

__all__ = [
    "DISTRIBUTION",
    "ENTRY_POINT_GROUP",
    "ProblemSink",
    "build_policy",
    "default_policies",
    "entry_point_targets",
    "find_factory",
    "load_custom_class",
    "policy_names",
]

log = logging.getLogger("kvproxy.policies")

ENTRY_POINT_GROUP = "kvproxy.policies"
DISTRIBUTION = "kafka-validation-proxy"
"""kvproxy's own distribution, whose entry points are the built-in policies."""
_CUSTOM_KEYS = frozenset({"class", "config"})

_found: dict[str, metadata.EntryPoint] | None = None
"""The entry points of the last scan, by name (scanned again when a name is not among them, so
a distribution installed since is found)."""


class ProblemSink(Protocol):
    """Where `build_policy` reports what is wrong (`kvproxy.policies.config`'s problem list)."""

    def add(self, path: KeyPath, message: str, at: KeyPath = ()) -> None: ...

    def hint(self, key: object, known: Iterable[str]) -> str: ...


DEFAULTS_GROUP = "kvproxy.defaults"
"""The entry-point group whose `policies` entry is the default chain's names."""


@functools.cache
def default_policies() -> tuple[str, ...]:
    """The policies of a config that names none: what kvproxy's own distribution declares in
    the entry point `policies` of `DEFAULTS_GROUP` (the framework names none itself)."""
    try:
        entries = metadata.distribution(DISTRIBUTION).entry_points.select(group=DEFAULTS_GROUP)
    except metadata.PackageNotFoundError:
        entries = metadata.EntryPoints(())
    for entry in entries:
        if entry.name == "policies":
            return tuple(str(name) for name in entry.load())
    raise PolicyConfigError(
        f"kvproxy's default policies are missing from the installed package metadata "
        f"(entry point policies of {DEFAULTS_GROUP} in {DISTRIBUTION}): reinstall kvproxy "
        "(pip install -e . in its checkout, or make setup)"
    )


def policy_names() -> list[str]:
    """Every policy name the YAML may use but `custom`."""
    return list(_entry_points())


def find_factory(name: str) -> Any | None:
    """The object the entry point `name` names (its `create` makes the policy); None when no
    installed distribution offers `name`."""
    entry = _entry_point(name)
    return None if entry is None else entry.load()


def entry_point_targets() -> dict[str, str]:
    """Policy name -> the `module:attr` its entry point names: what a process without the
    installed metadata (a Spark executor given the code as a zip) loads instead of scanning.
    Scans afresh: a distribution installed since the last scan is what the caller ships."""
    return {name: entry.value for name, entry in _entry_points(rescan=True).items()}


def _entry_points(*, rescan: bool = False) -> dict[str, metadata.EntryPoint]:
    global _found  # noqa: PLW0603 - a cache of what is installed, refreshed on a miss
    if _found is None or rescan:
        if rescan:
            importlib.invalidate_caches()
        _found = _scan()
    return _found


def _entry_point(name: str, targets: Mapping[str, str] | None = None) -> metadata.EntryPoint | None:
    if targets is not None:
        target = targets.get(name)
        if target is None:
            return None
        return metadata.EntryPoint(name=name, value=target, group=ENTRY_POINT_GROUP)
    entry = _entry_points().get(name)
    if entry is None:
        entry = _entry_points(rescan=True).get(name)
    return entry


def _scan() -> dict[str, metadata.EntryPoint]:
    """The group's entry points; kvproxy's own win over another distribution's of that name."""
    try:
        own = list(metadata.distribution(DISTRIBUTION).entry_points.select(group=ENTRY_POINT_GROUP))
    except metadata.PackageNotFoundError:
        own = []
    if not own:
        raise PolicyConfigError(
            f"kvproxy's built-in policies are missing from the installed package metadata "
            f"(entry-point group {ENTRY_POINT_GROUP} of {DISTRIBUTION}): reinstall kvproxy "
            "(pip install -e . in its checkout, or make setup)"
        )
    found = {entry.name: entry for entry in own}
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in found:
            found[entry.name] = entry
        elif found[entry.name].value != entry.value:
            log.warning(
                "policy %s of %s is ignored: kvproxy's own policy has that name",
                entry.name,
                entry.value,
            )
    return found


def build_policy(
    where: KeyPath,
    spec: Any,
    context: PolicyContext,
    problems: ProblemSink,
    targets: Mapping[str, str] | None = None,
) -> RecordsPolicy | None:
    """The policy a `policies:` item names, configured; None when it has a problem (reported).

    `targets` (`entry_point_targets` of another process) replaces the scan of the installed
    entry points."""
    if isinstance(spec, str):
        name, options = spec, None
    elif isinstance(spec, Mapping) and len(spec) == 1:
        ((name, options),) = spec.items()
    else:
        problems.add(
            where,
            "a policy is a name or a one-key mapping {name: {options}}, not " + short_repr(spec),
        )
        return None
    if name == "custom":
        return _build_custom(where, options, context, problems)
    entry = _entry_point(name, targets) if isinstance(name, str) else None
    if entry is None:
        known = policy_names() if targets is None else list(targets)
        hint = problems.hint(name, [*known, "custom"])
        problems.add(where, f"unknown policy {short_repr(name)}{hint}")
        return None
    if options is not None and not isinstance(options, Mapping):
        problems.add(
            where, f"policy {name}: options must be a mapping, not {kind_of(options)}", (name,)
        )
        return None
    try:
        factory = entry.load()
    except Exception as exc:
        problems.add(where, f"policy {name}: cannot load {entry.value}: {cut(repr(exc))}", (name,))
        return None
    return _create(
        where,
        _Named(f"policy {name}", name, (name,), (name,)),
        factory,
        options=options or {},
        context=context,
        problems=problems,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Named:
    """How a YAML entry's problems name it: `policy crc` or `custom module:Class`, the name its
    policy gets if it sets none, and the keys of the entry its problems point at."""

    label: str
    name: str
    options_at: KeyPath
    """Where the options are (`crc`, or `custom.config`)."""
    policy_at: KeyPath
    """Where the policy is named (`crc`, or `custom.class`)."""


def _create(
    where: KeyPath,
    named: _Named,
    factory: Any,
    *,
    options: Mapping[str, Any],
    context: PolicyContext,
    problems: ProblemSink,
) -> RecordsPolicy | None:
    """`factory.create(context, options)`, the one way every policy is built; None when the
    options or the policy have a problem (reported)."""
    accepted = getattr(factory, "OPTIONS", None)
    if isinstance(accepted, Mapping):
        unknown = [key for key in options if key not in accepted]
        for key in unknown:
            hint = problems.hint(key, accepted)
            problems.add(
                where,
                f"{named.label}: unknown option {short_repr(key)}{hint}",
                (*named.options_at, key),
            )
        if unknown:
            return None
    if not callable(getattr(factory, "create", None)):
        problems.add(where, f"{named.label}: has no create(context, options)", named.policy_at)
        return None
    if context.producer_state is not None and Need.PRODUCER_STATE not in needs_of(factory):
        context = dataclasses.replace(context, producer_state=None)  # only to who declares it
    try:
        policy = factory.create(context, options)
    except PolicyConfigError as exc:
        problems.add(where, str(exc), named.options_at)
        return None
    except Exception as exc:
        problems.add(where, f"{named.label}: create failed: {cut(repr(exc))}", named.options_at)
        return None
    if not getattr(policy, "name", None):
        policy.name = named.name
    problem = declaration_problem(policy)
    if problem:
        _close(policy)
        problems.add(where, f"{named.label}: {problem}", named.policy_at)
        return None
    return policy  # type: ignore[no-any-return]


def _close(policy: Any) -> None:
    try:
        policy.close()
    except Exception:
        log.exception("policy %r failed to close", policy)


def _build_custom(
    where: KeyPath, options: Any, context: PolicyContext, problems: ProblemSink
) -> RecordsPolicy | None:
    if not isinstance(options, Mapping):
        problems.add(where, "custom needs {class: 'module:Class', config: {...}}", ("custom",))
        return None
    unknown = [key for key in options if key not in _CUSTOM_KEYS]
    for key in unknown:
        hint = problems.hint(key, _CUSTOM_KEYS)
        problems.add((*where, "custom", key), f"unknown key{hint}")
    target = options.get("class")
    if not isinstance(target, str):
        problems.add(where, "custom: class must be 'module:Class'", ("custom", "class"))
        return None
    config = options.get("config") or {}
    if not isinstance(config, Mapping):
        problems.add(
            where,
            f"custom {target}: config must be a mapping, not {kind_of(config)}",
            ("custom", "config"),
        )
        return None
    try:
        cls = load_custom_class(target, context.base_dir)
    except PolicyConfigError as exc:
        problems.add(where, str(exc), ("custom", "class"))
        return None
    if unknown:  # a misspelt `config` would be configured as empty: a misleading second problem
        return None
    name = getattr(cls, "__name__", target)
    named = _Named(f"custom {target}", name, ("custom", "config"), ("custom", "class"))
    return _create(where, named, cls, options=config, context=context, problems=problems)


def load_custom_class(target: str, base_dir: Path) -> Any:
    """Import `module:Class`. A module that is not importable as is is looked for beside the
    configuration file: `base_dir`, then its parent, is put at the front of `sys.path` (and kept
    there, so that the module's own imports of its neighbours work too), so that
    `examples.policies:X` works beside `examples/kvproxy.yaml` (docs/policies.md)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise PolicyConfigError(f"custom class {short_repr(target)} must be written 'module:Class'")
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
