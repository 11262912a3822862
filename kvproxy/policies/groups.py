"""Policies that run together as one step, in the order their stages declare, whatever order the
YAML lists them in: the broker's own checks run in Kafka's order, their record errors merged.

A policy joins a group by declaring `group` (the group's name) and `stages` (`Stage`s: which of
its methods run, and where among the group's stages); the chain knows no policy by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvproxy.policies.api import (
    ACCEPT,
    INVALID_RECORD_REJECTION,
    MISSING_KEY,
    ProducedRecords,
    RecordError,
    RecordErrorList,
    RecordsPolicy,
    Stage,
    Verdict,
    record_errors_verdict,
)
from kvproxy.policies.declaration import Declaration, declaration_of
from kvproxy.protocol import error_codes
from kvproxy.protocol.budget import ResourceLimit

__all__ = ["PolicyFailed", "PolicyGroup", "chain_steps", "merge_record_errors"]


class PolicyFailed(Exception):
    """A stage inside a `PolicyGroup` raised: the chain answers it as that policy's failure."""

    def __init__(self, policy: str, error: Exception) -> None:
        super().__init__(f"policy {policy} failed: {error!r}")
        self.policy = policy
        self.error = error


_Step = tuple[str, int | None, str | None, Callable[[ProducedRecords], Any]]
"""(policy name, record code or None for a verdict stage, rejection, the check)."""


class PolicyGroup:
    """The stages of a group's policies, run in their declared order as one step of the chain.

    A stage answering a verdict that rejects is the group's answer, named after its policy.
    Record stages that follow each other all run, and their errors make one verdict
    (`merge_record_errors`), answered before the next verdict stage runs.
    """

    def __init__(
        self,
        name: str,
        policies: Sequence[RecordsPolicy],
        declarations: Sequence[Declaration] | None = None,
    ) -> None:
        self.name = name
        self.policies = tuple(policies)
        if declarations is None:
            declarations = [declaration_of(policy) for policy in self.policies]
        staged = [
            (stage, policy)
            for policy, declared in zip(self.policies, declarations, strict=True)
            for stage in declared.stages or (Stage(0),)
        ]
        staged.sort(key=lambda pair: pair[0].order)  # stable: a policy's stages of one order
        self._steps: tuple[_Step, ...] = tuple(
            (policy.name, stage.record_code, stage.rejection, _stage_call(policy, stage))
            for stage, policy in staged
        )

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        name = ""  # the stage running: an exception leaves as `PolicyFailed` naming its policy
        found: list[tuple[str, int, str | None, RecordErrorList]] = []
        try:
            for name, code, rejection, call in self._steps:
                if code is not None:
                    errors = call(batch)
                    if errors:
                        found.append((name, code, rejection, errors))
                    continue
                if found:
                    return merge_record_errors(found)
                verdict: Verdict = call(batch)
                if verdict.code:
                    return verdict.with_policy(name)
        except ResourceLimit:
            raise  # not the policy's failure: the chain's caller answers it
        except Exception as exc:
            raise PolicyFailed(name, exc) from exc
        return merge_record_errors(found) if found else ACCEPT

    def close(self) -> None:
        """The chain closes the grouped policies themselves."""


def _stage_call(policy: RecordsPolicy, stage: Stage) -> Callable[[ProducedRecords], Any]:
    if stage.method == "validate":
        return lambda produced: policy.validate(produced.topic, produced.partition, produced)
    method: Callable[[ProducedRecords], Any] = getattr(policy, stage.method)
    return method


def chain_steps(
    policies: Sequence[RecordsPolicy], declarations: Sequence[Declaration]
) -> tuple[RecordsPolicy, ...]:
    """What a chain runs: each group's policies as one `PolicyGroup`, first (in the order the
    groups first appear), then the other policies in the order listed.

    Only the first policy of a name joins its group (a second one runs where it is listed), so
    does a policy that declares no `group`, whatever its name.
    """
    groups: dict[str, dict[str, tuple[RecordsPolicy, Declaration]]] = {}
    rest: list[RecordsPolicy] = []
    for policy, declared in zip(policies, declarations, strict=True):
        group = declared.group
        members = groups.setdefault(group, {}) if group is not None else None
        if members is not None and policy.name not in members:
            members[policy.name] = (policy, declared)
        else:
            rest.append(policy)
    grouped = [
        PolicyGroup(name, [p for p, _ in members.values()], [d for _, d in members.values()])
        for name, members in groups.items()
    ]
    return (*grouped, *rest)


def merge_record_errors(found: Sequence[tuple[str, int, str | None, RecordErrorList]]) -> Verdict:
    """One verdict from the record errors of several checks (given in Kafka's precedence).

    Each record keeps its first error, as LogValidator.validateRecord stops at a record's first
    failing check; the errors are listed by record index. Any timestamp error makes the code
    INVALID_TIMESTAMP (LogValidator.processRecordErrors), else INVALID_RECORD. Past
    MAX_RECORD_ERRORS kept errors per check, the total counted is the largest check's.
    """
    if len(found) == 1:
        name, code, rejection, errors = found[0]
        return record_errors_verdict(errors, code=code, rejection=rejection, policy=name)
    first: dict[int, tuple[RecordError, str, int, str | None]] = {}
    for name, code, rejection, errors in found:
        for error in errors:
            if error.index not in first:
                named = RecordError(error.index, error.message, name)
                first[error.index] = (named, name, code, rejection)
    entries = [first[index] for index in sorted(first)]
    merged = RecordErrorList()
    for error, _, _, _ in entries:
        merged.append(error)
    merged.total = max(len(first), *(errors.total for _, _, _, errors in found))
    timestamp = next((e for e in entries if e[2] == error_codes.INVALID_TIMESTAMP), None)
    if timestamp is not None:
        return record_errors_verdict(
            merged, code=error_codes.INVALID_TIMESTAMP, rejection=None, policy=timestamp[1]
        )
    rejections = {entry[3] for entry in entries}
    rejection = MISSING_KEY if rejections == {MISSING_KEY} else INVALID_RECORD_REJECTION
    return record_errors_verdict(
        merged, code=error_codes.INVALID_RECORD, rejection=rejection, policy=entries[0][1]
    )
