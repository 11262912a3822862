"""Topic patterns, read one way wherever the configuration names topics: an exact name, a glob
(`orders-*`, `?`, `[...]`) or a regular expression between slashes (`/orders-\\d+/`, full match).
Matching is case-sensitive, as topic names are.

Globs and regular expressions run on RE2 (`kvproxy.policies.linear_regex`): the time to match a
name is linear in its length whatever the pattern, and a /regex/ RE2 cannot compile (backreferences,
lookaround) is a config error. `FirstMatch` answers which of many patterns matches first with a few
combined expressions instead of trying each pattern in turn.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from kvproxy.policies.errors import short_repr
from kvproxy.policies.linear_regex import LinearPattern, LinearRegexError, compile_linear

__all__ = ["FirstMatch", "PatternError", "any_of", "compile_pattern", "is_regex"]

Matcher = Callable[[str], bool]

_GROUP_SIZE = 64
"""Patterns per combined expression of `FirstMatch`: finding the first match costs at most
(patterns / 64) + 64 expressions, each linear in the name."""


class PatternError(ValueError):
    """A /regex/ pattern that does not compile; the message quotes it and says why."""


def is_regex(pattern: str) -> bool:
    """Whether `pattern` is a regular expression (written between slashes)."""
    return len(pattern) >= 2 and pattern.startswith("/") and pattern.endswith("/")


def is_glob(pattern: str) -> bool:
    """Whether `pattern` (not a /regex/) is a glob rather than an exact name."""
    return any(ch in pattern for ch in "*?[")


def glob_regex(glob: str) -> str:
    """`glob` as an RE2 expression (fnmatch's rules: `*`, `?`, `[seq]`, `[!seq]`)."""
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        ch = glob[i]
        i += 1
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch == "[":
            end = i + 1 if i < n and glob[i] == "!" else i
            end = end + 1 if end < n and glob[end] == "]" else end
            end = glob.find("]", end)
            if end < 0:
                out.append(re.escape(ch))
                continue
            body = glob[i:end]
            i = end + 1
            negated = body.startswith("!")
            body = body[1:] if negated else body
            escaped = "".join("\\" + c if c in "\\^[]" else c for c in body)
            out.append(f"[{'^' if negated else ''}{escaped}]")
        else:
            out.append(re.escape(ch))
    return "(?s:" + "".join(out) + ")"


def _expression(pattern: str) -> str | None:
    """The RE2 expression `pattern` stands for; None for an exact name."""
    if is_regex(pattern):
        return pattern[1:-1]
    if is_glob(pattern):
        return glob_regex(pattern)
    return None


def _compiled(pattern: str, expression: str) -> LinearPattern:
    try:
        return compile_linear(expression)
    except LinearRegexError as exc:
        raise PatternError(
            f"{short_repr(pattern)} is not a valid regular expression: {exc}"
        ) from None


def compile_pattern(pattern: str) -> Matcher:
    """A test of topic names against `pattern`; PatternError for a /regex/ RE2 cannot compile."""
    expression = _expression(pattern)
    if expression is None:
        return lambda topic: topic == pattern
    regex = _compiled(pattern, expression)
    return lambda topic: regex.fullmatch(topic) is not None


def any_of(patterns: Iterable[str]) -> Matcher:
    """A test of topic names against each of `patterns` (true when one matches)."""
    first = FirstMatch(list(patterns))
    return lambda topic: first.index(topic) is not None


class FirstMatch:
    """Which of `patterns` (in order) a name matches first.

    Exact names are one dict lookup. The others are tried as one RE2 alternation of all of them
    (most names match none), then by groups of `_GROUP_SIZE` alternations, then one by one in
    the first group that matches: a name costs a few expressions, not one per pattern.
    PatternError for the first pattern RE2 cannot compile."""

    __slots__ = ("_any", "_exact", "_groups", "_patterns")

    def __init__(self, patterns: Sequence[str]) -> None:
        self._exact: dict[str, int] = {}
        expressions: list[tuple[int, LinearPattern, str]] = []
        for index, pattern in enumerate(patterns):
            expression = _expression(pattern)
            if expression is None:
                self._exact.setdefault(pattern, index)
            else:
                expressions.append((index, _compiled(pattern, expression), expression))
        self._patterns = tuple((index, regex) for index, regex, _ in expressions)
        self._groups: tuple[tuple[int, LinearPattern], ...] = tuple(
            (start, _alternation(e for _, _, e in expressions[start : start + _GROUP_SIZE]))
            for start in range(0, len(expressions), _GROUP_SIZE)
        )
        self._any = _alternation(e for _, _, e in expressions) if expressions else None

    def index(self, name: str) -> int | None:
        """The position of the first pattern `name` matches; None when none does."""
        exact = self._exact.get(name)
        if self._any is None or self._any.fullmatch(name) is None:
            return exact
        for start, group in self._groups:
            if group.fullmatch(name) is not None:
                for index, regex in self._patterns[start : start + _GROUP_SIZE]:
                    if regex.fullmatch(name) is not None:
                        return index if exact is None else min(index, exact)
        return exact  # not reached: the alternation of all matched, so one group does


def _alternation(expressions: Iterable[str]) -> LinearPattern:
    """One expression matching what any of `expressions` matches (their groups not captured,
    so two may use one group name)."""
    combined = "|".join(f"(?:{expression})" for expression in expressions)
    try:
        return compile_linear(combined, never_capture=True)
    except LinearRegexError as exc:  # each compiled alone: only their size together
        raise PatternError(f"the topic patterns together are too large for RE2: {exc}") from None
