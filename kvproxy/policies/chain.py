"""A topic's ordered policies: run them, stop at the first rejection, never let one crash us."""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvproxy.policies.accept_form import AcceptForm, merged_forms
from kvproxy.policies.api import (
    ACCEPT,
    PARSING,
    Need,
    PolicyViolation,
    ProducedRecords,
    RecordsPolicy,
    TopicConfig,
    Verdict,
)
from kvproxy.policies.declaration import Declaration, declaration_of
from kvproxy.policies.groups import PolicyFailed, chain_steps
from kvproxy.protocol import error_codes
from kvproxy.protocol.budget import ResourceLimit
from kvproxy.protocol.errors import DecodeError, InvalidRecords

__all__ = ["CRASH_LOG_INTERVAL_S", "Mode", "PolicyChain"]

log = logging.getLogger("kvproxy.policies")

CRASH_LOG_INTERVAL_S = 60.0
"""A crashing policy's traceback is logged at most once per this many seconds (per policy)."""


class Mode(enum.Enum):
    """What the caller does with a rejection: answer it, only log it, or not check at all."""

    ENFORCE = "enforce"
    WARN = "warn"
    OFF = "off"


class PolicyChain:
    """Policies run in order; the first rejection is the chain's verdict.

    Policies that declare a `group` run first, together, in the order of their declared
    `stages` whatever order they are listed in (`kvproxy.policies.groups`: the broker's own
    checks in Kafka's order, the CRC before the batch's fields, record errors of several checks
    merged); the other policies follow in the order listed.

    The verdict is returned whatever the mode: the caller decides what `warn` means. An `off`
    chain holds no policies. `PolicyViolation` becomes POLICY_VIOLATION (44) with its message;
    records whose batch declares another count than it holds, or that do not parse although
    the CRC holds, become INVALID_RECORD with Kafka's reason (`InvalidRecords`); other records
    that turn out not to decode become CORRUPT_MESSAGE; any other exception fails closed
    with INVALID_RECORD (87), is counted in `crash_counts` and logged with its traceback at most
    once per `CRASH_LOG_INTERVAL_S` per policy. A `ResourceLimit` (decoding would need more memory
    than the request may hold) is raised to the caller, which answers it.
    """

    __slots__ = (
        "_choosers",
        "_last_logged",
        "_steps",
        "clock",
        "crash_counts",
        "declarations",
        "mode",
        "names",
        "needs",
        "observers",
        "parsed_by",
        "policies",
    )

    def __init__(
        self,
        policies: Sequence[RecordsPolicy],
        mode: Mode = Mode.ENFORCE,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mode = Mode(mode)
        self.policies: tuple[RecordsPolicy, ...] = () if self.mode is Mode.OFF else tuple(policies)
        self.names: tuple[str, ...] = tuple(policy.name for policy in self.policies)
        """The policies' names in order (read per request, so kept)."""
        self.declarations: tuple[Declaration, ...] = tuple(map(declaration_of, self.policies))
        """What each policy declares (`kvproxy.policies.declaration`), read once."""
        self.needs: frozenset[Need] = frozenset().union(*(d.needs for d in self.declarations))
        """What the chain's policies need from the proxy (`Need`), worked out once."""
        watching = [
            (policy, declared)
            for policy, declared in zip(self.policies, self.declarations, strict=True)
            if Need.BROKER_ANSWER in declared.needs
        ]
        self.observers: tuple[Any, ...] = tuple(policy for policy, _ in watching)
        """The policies shown the broker's answer (`observe`); empty for most chains."""
        self._choosers = tuple(declared.wants_answer for _, declared in watching)
        self.parsed_by: str = next((d.name for d in self.declarations if d.judges_parsing), PARSING)
        """The name refusals of bytes that do not parse are given (`Declaration.judges_parsing`;
        `PARSING` in a chain with no such policy)."""
        self._steps = chain_steps(self.policies, self.declarations)
        self.crash_counts: dict[str, int] = {}
        self.clock = clock
        self._last_logged: dict[tuple[str, str], float] = {}

    def __repr__(self) -> str:
        names = ", ".join(policy.name for policy in self.policies)
        return f"PolicyChain(mode={self.mode.value}, policies=[{names}])"

    def check(self, produced: ProducedRecords) -> Verdict:
        topic = produced.topic
        partition = produced.partition
        for policy in self._steps:
            try:
                verdict = policy.validate(topic, partition, produced)
            except ResourceLimit:
                raise  # not the policy's failure: the caller answers it
            except PolicyFailed as failed:
                return self._failed(failed.policy, failed.error, produced)
            except Exception as exc:
                return self._failed(policy.name, exc, produced)
            if verdict.code:
                return verdict.with_policy(policy.name)
        return ACCEPT

    def accept_form(self, config: TopicConfig) -> AcceptForm | None:
        """The chain's compiled fast-accept form on a topic with these settings: every policy's
        form merged, or None when one has none (`kvproxy.policies.accept_form`). A policy whose
        `accept_form` raises has none: its requests go the Python way."""
        forms: list[AcceptForm | None] = []
        for declared in self.declarations:
            if declared.accept_form is None:
                return None
            try:
                forms.append(declared.accept_form(config))
            except Exception as exc:
                self._log_crash(declared.name, exc, "failed to give its accept form", "form")
                return None
        return merged_forms(forms)

    def wants_answer(self, produced: ProducedRecords) -> bool:
        """Whether an observer wants the broker's answer to `produced`: one with a
        `wants_answer(produced)` of its own may decline (`producer_state` for a plain
        producer's batches), so that the answer is decoded only when someone reads it."""
        return any(wants is None or wants(produced) for wants in self._choosers)

    def observe(self, produced: ProducedRecords, error_code: int) -> None:
        """Show the observers the broker's answer to a partition the chain let through; one
        that raises is logged (at most once per `CRASH_LOG_INTERVAL_S`) and the others still
        see it: the client's answer is the broker's whatever an observer does."""
        for policy in self.observers:
            try:
                policy.observe(produced.topic, produced.partition, produced, error_code)
            except Exception as exc:
                self._log_crash(
                    policy.name, exc, "failed to observe the broker's answer", key="observe"
                )

    def _failed(self, name: str, exc: Exception, produced: ProducedRecords) -> Verdict:
        """The verdict when policy `name` raised `exc` instead of answering."""
        if isinstance(exc, PolicyViolation):
            return Verdict(error_codes.POLICY_VIOLATION, str(exc), policy=name)
        if isinstance(exc, InvalidRecords):  # Kafka's record iterators' words, INVALID_RECORD
            return Verdict(error_codes.INVALID_RECORD, str(exc), policy=name)
        if isinstance(exc, DecodeError):
            return Verdict(
                error_codes.CORRUPT_MESSAGE,
                f"Record is corrupt in topic partition {produced.topic_partition}: {exc}",
                policy=name,
            )
        return self._crashed(name, exc)

    def _crashed(self, name: str, exc: Exception) -> Verdict:
        self.crash_counts[name] = self.crash_counts.get(name, 0) + 1
        count = self.crash_counts[name]
        self._log_crash(name, exc, f"failed ({count} failures so far); rejecting the partition")
        return Verdict(
            error_codes.INVALID_RECORD,
            f"policy {name} failed: {exc!r}",
            policy=name,
        )

    def _log_crash(self, name: str, exc: Exception, what: str, key: str = "validate") -> None:
        """Log `exc` with its traceback, at most once per `CRASH_LOG_INTERVAL_S` per policy and
        per `key` (a failed `observe` does not silence the next failed `validate`)."""
        now = self.clock()
        last = self._last_logged.get((name, key))
        if last is None or now - last >= CRASH_LOG_INTERVAL_S:
            self._last_logged[(name, key)] = now
            log.error("policy %s %s", name, what, exc_info=exc)

    def close(self) -> None:
        for policy in self.policies:
            try:
                policy.close()
            except Exception:
                log.exception("policy %s failed to close", policy.name)
