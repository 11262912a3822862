"""Topic patterns, read one way wherever the configuration names topics: an exact name, a glob
(`orders-*`, `?`, `[...]`) or a regular expression between slashes (`/orders-\\d+/`, full match).
Matching is case-sensitive, as topic names are."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable

from policies.builtin.base import short_repr

__all__ = ["PatternError", "any_of", "compile_pattern", "is_regex"]

Matcher = Callable[[str], bool]


class PatternError(ValueError):
    """A /regex/ pattern that does not compile; the message quotes it and says why."""


def is_regex(pattern: str) -> bool:
    """Whether `pattern` is a regular expression (written between slashes)."""
    return len(pattern) >= 2 and pattern.startswith("/") and pattern.endswith("/")


def compile_pattern(pattern: str) -> Matcher:
    """A test of topic names against `pattern`; PatternError for a /regex/ that does not compile."""
    if is_regex(pattern):
        try:
            regex = re.compile(pattern[1:-1])
        except (re.error, RecursionError, OverflowError) as exc:  # the last two: too deep, too big
            raise PatternError(
                f"{short_repr(pattern)} is not a valid regular expression: {exc}"
            ) from None
        return lambda topic: regex.fullmatch(topic) is not None
    if any(ch in pattern for ch in "*?["):
        glob = re.compile(fnmatch.translate(pattern))
        return lambda topic: glob.match(topic) is not None
    return lambda topic: topic == pattern


def any_of(patterns: Iterable[str]) -> Matcher:
    """A test of topic names against each of `patterns` (true when one matches)."""
    matchers = [compile_pattern(pattern) for pattern in patterns]
    return lambda topic: any(matches(topic) for matches in matchers)
