"""What a policy declares on itself, read once, here, when its chain is built.

A policy is any object of the `RecordsPolicy` shape; what it may declare besides (what it
reads, where its checks run, how its refusals are attributed) is optional. This module is the
one reader of those declarations: the chain, its groups, the schema-id gathering, the topic
settings and the plugin loader read the `Declaration`, never the policy's attributes, and the
framework names no policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvproxy.policies.accept_form import AcceptForm
from kvproxy.policies.api import Need, ProducedRecords, Stage, TopicConfig
from kvproxy.policies.errors import short_repr
from kvproxy.policies.topic_settings import FIELD_NAMES

__all__ = ["Declaration", "declaration_of", "declaration_problem", "needs_of"]


@dataclass(frozen=True)
class Declaration:
    """A policy's declarations, as the framework reads them (see `RecordsPolicy`)."""

    name: str
    needs: frozenset[Need] = frozenset()
    """The `Need`s the proxy serves it (`TOPIC_CONFIG` too when it names `topic_settings`)."""
    settings_read: frozenset[str] = frozenset()
    """The `TopicConfig` fields it reads from the topic (not those its YAML options set)."""
    settings_from_options: Mapping[str, tuple[str, object]] = field(default_factory=dict)
    """`TopicConfig` field -> (option, value) for each option the YAML sets that stands for
    that topic setting (its `setting_options`): the policy reads the option, not the topic."""
    group: str | None = None
    """The group it runs in (`kvproxy.policies.groups`), first in the chain."""
    stages: tuple[Stage, ...] = ()
    """Where its checks run among its group's stages (none: `validate` at order 0)."""
    judges_parsing: bool = False
    """Bytes that do not parse as record batches are refused in its name (`parse_records`'
    verdicts): the policy that checks the batches' structure says so with `judges_parsing`."""
    wants_answer: Callable[[ProducedRecords], bool] | None = None
    """For `Need.BROKER_ANSWER`: whether it wants the broker's answer to these records (None:
    always)."""
    schema_ids_wanted: Callable[[str, ProducedRecords], set[int]] | None = None
    """For `Need.SCHEMAS`: the ids it will ask about (None: every id keys and values carry)."""
    accept_form: Callable[[TopicConfig], AcceptForm | None] | None = None
    """Its compiled fast-accept form on a topic with these settings (None: it has none, and
    its chain's requests are decided by the Python path alone)."""


def needs_of(declarer: object) -> frozenset[Need]:
    """What `declarer` (a policy, or the factory that makes it) declares it needs: its `needs`,
    and `TOPIC_CONFIG` when it names the settings it reads in `topic_settings`."""
    needs = frozenset(getattr(declarer, "needs", None) or ())
    if getattr(declarer, "topic_settings", None) is not None:
        needs |= {Need.TOPIC_CONFIG}
    return needs


def declaration_of(policy: Any) -> Declaration:
    """Read `policy`'s declarations (checked by `declaration_problem` when it was loaded)."""
    needs = needs_of(policy)
    from_options = _settings_from_options(policy)
    declared = getattr(policy, "topic_settings", None)
    if declared is not None:
        read = frozenset(declared) - from_options.keys()
    else:
        read = frozenset(FIELD_NAMES) if Need.TOPIC_CONFIG in needs else frozenset()
    group = getattr(policy, "group", None)
    return Declaration(
        name=policy.name,
        needs=needs,
        settings_read=read,
        settings_from_options=from_options,
        group=group if isinstance(group, str) else None,
        stages=tuple(getattr(policy, "stages", None) or ()),
        judges_parsing=bool(getattr(policy, "judges_parsing", False)),
        wants_answer=getattr(policy, "wants_answer", None),
        schema_ids_wanted=getattr(policy, "schema_ids_wanted", None),
        accept_form=getattr(policy, "accept_form", None),
    )


def _settings_from_options(policy: Any) -> dict[str, tuple[str, object]]:
    explicit = getattr(policy, "explicit", None)
    if not explicit:
        return {}
    options = getattr(policy, "options", {})
    table = getattr(policy, "setting_options", None) or {}
    return {
        field_name: (option, options.get(option))
        for option, field_name in table.items()
        if option in explicit
    }


def declaration_problem(policy: Any) -> str:
    """What a policy lacks that the chain calls, or a declaration it cannot read; "" if none."""
    for method in ("validate", "close"):
        if not callable(getattr(policy, method, None)):
            return f"has no {method}() method"
    declared = getattr(policy, "needs", None) or ()
    if isinstance(declared, str | bytes) or not all(isinstance(n, Need) for n in declared):
        return f"needs must hold policies.api.Need members, not {short_repr(declared)}"
    if Need.BROKER_ANSWER in needs_of(policy) and not callable(getattr(policy, "observe", None)):
        return "needs BROKER_ANSWER but has no observe() method"
    for stage in getattr(policy, "stages", None) or ():
        if not isinstance(stage, Stage):
            return f"stages must hold policies.api.Stage values, not {short_repr(stage)}"
        if not callable(getattr(policy, stage.method, None)):
            return f"stage {stage.order} runs {stage.method}(), which it has not"
    for optional in ("wants_answer", "schema_ids_wanted", "accept_form"):
        found = getattr(policy, optional, None)
        if found is not None and not callable(found):
            return f"{optional} must be a method, not {short_repr(found)}"
    return ""
