"""Regular expressions written outside the process (a registry's JSON Schema, the config file),
compiled with RE2, whose matching takes time linear in the text whatever the pattern: Python's
`re` backtracks, and `^(a+)+$` against 60 characters would hold the event loop for years.

RE2 has no backreferences and no lookaround. A pattern that needs them is refused where it is
compiled (`LinearRegexError`, which says why); it is never run by a backtracking engine instead.
`compile_json_schema` builds fastjsonschema validators whose `pattern`, `patternProperties` and
`format: regex` use RE2 the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final, Protocol

import fastjsonschema
import fastjsonschema.draft04
import fastjsonschema.draft06
import fastjsonschema.draft07
import fastjsonschema.draft2019
import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

from kvproxy.policies.errors import cut

__all__ = ["LinearPattern", "LinearRegexError", "compile_json_schema", "compile_linear"]

MAX_PROGRAM_BYTES: Final = 64 * 1024 * 1024
"""RE2's memory for one compiled pattern (its default is 8 MiB): enough for the combined
matcher of the largest rule set (`kvproxy.policies.topic_patterns`); a pattern past it is
refused."""


class LinearRegexError(ValueError):
    """A pattern RE2 cannot compile: bad syntax, or syntax only a backtracking engine has."""


class LinearPattern(Protocol):
    """What the callers use of a compiled RE2 pattern (re2 has no type information)."""

    @property
    def pattern(self) -> str: ...

    def search(self, text: str) -> object | None: ...

    def match(self, text: str) -> object | None: ...

    def fullmatch(self, text: str) -> object | None: ...


_REPETITION = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")
_MAX_REPEAT = 1000
"""RE2 refuses `{1001}`, but reads a count too large for an int (`{99999999999}`) as the
literal text: such a pattern is refused here, as a backtracking engine would."""


def _options(*, never_capture: bool = False) -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would print every refused pattern to stderr
    options.max_mem = MAX_PROGRAM_BYTES
    options.never_capture = never_capture
    return options


def compile_linear(pattern: str, *, never_capture: bool = False) -> LinearPattern:
    """`pattern` compiled by RE2; LinearRegexError (with RE2's reason) when it cannot be.
    `never_capture`: groups do not capture (alternatives of several patterns may then repeat a
    group name)."""
    for repeat in _REPETITION.finditer(pattern):
        if any(len(n) > 4 or int(n) > _MAX_REPEAT for n in repeat.groups() if n):
            raise LinearRegexError(
                f"the repetition {cut(repeat.group(), 40)} is over {_MAX_REPEAT:,} (RE2's limit)"
            )
    try:
        compiled: LinearPattern = re2.compile(pattern, _options(never_capture=never_capture))
    except re2.error as exc:
        raise LinearRegexError(_reason(exc)) from None
    except (TypeError, UnicodeEncodeError) as exc:  # a lone surrogate cannot be UTF-8
        raise LinearRegexError(str(exc)) from None
    return compiled


def _reason(exc: Exception) -> str:
    reason = exc.args[0] if exc.args else ""
    if isinstance(reason, bytes):
        reason = reason.decode("utf-8", "replace")
    description, _, fragment = str(reason).partition(": ")  # RE2 quotes the pattern's rest
    reason = f"{description}: {cut(fragment, 40)}" if fragment else description
    if "invalid perl operator" in reason or "invalid escape sequence" in reason:
        reason += " (RE2 syntax: no backreferences, lookahead or lookbehind)"
    return reason


# --- fastjsonschema ----------------------------------------------------------------------

_END_OF_TEXT = re.compile(r"(?<!\\)\\Z")
"""fastjsonschema writes a pattern's `$` as Python's `\\Z`, which RE2 spells `\\z`."""

_LIBRARY_FORMATS: Final = frozenset(
    regex
    for generator in (
        fastjsonschema.draft04.CodeGeneratorDraft04,
        fastjsonschema.draft06.CodeGeneratorDraft06,
        fastjsonschema.draft07.CodeGeneratorDraft07,
        fastjsonschema.draft2019.CodeGeneratorDraft2019,
    )
    for regex in generator.FORMAT_REGEXS.values()
)
"""fastjsonschema's own `format` expressions (email, duration...): fixed in the library, not
from outside, and three of them use lookahead, so they stay with `re`."""


class _SchemaRegex:
    """Stands for the `re` module inside fastjsonschema's code generator and its validators:
    every expression a schema brings (`pattern`, `patternProperties`, which the generator also
    runs against `required` names, and `format: regex` values) is compiled by RE2."""

    error = LinearRegexError

    def compile(self, pattern: str, flags: int = 0) -> Any:
        if pattern in _LIBRARY_FORMATS:
            return re.compile(pattern, flags)
        try:
            return compile_linear(_END_OF_TEXT.sub(r"\\z", pattern))
        except LinearRegexError as exc:
            raise LinearRegexError(f"pattern {pattern!r} is not supported: {exc}") from None

    def search(self, pattern: str, text: str, flags: int = 0) -> Any:
        return self.compile(pattern, flags).search(text)

    def sub(self, pattern: str, replacement: str, text: str, count: int = 0) -> str:
        return re.sub(pattern, replacement, text, count=count)  # the library's own names


_SCHEMA_REGEX: Final = _SchemaRegex()
fastjsonschema.draft04.re = _SCHEMA_REGEX  # type: ignore[attr-defined,assignment]
"""The generator of every draft (06, 07 and 2019 inherit 04's methods) looks `re` up here."""


def compile_json_schema(definition: Any, **options: Any) -> Callable[[Any], Any]:
    """`fastjsonschema.compile(definition, **options)` with RE2 for the schema's expressions;
    fastjsonschema's JsonSchemaDefinitionException, or LinearRegexError naming the pattern RE2
    cannot compile."""
    validate: Callable[[Any], Any] = fastjsonschema.compile(definition, **options)
    scope = getattr(getattr(validate, "__wrapped__", validate), "__globals__", None)
    if isinstance(scope, dict) and "re" in scope:
        scope["re"] = _SCHEMA_REGEX  # `format: regex` compiles the value being checked
    return validate
