"""Hostile configuration files: what `kvproxy check` (and so `serve` and a reload) says about a
file built to exhaust its reader, and how long an error message can get.

A file of a few hundred bytes with nested YAML aliases expands to hundreds of millions of values;
a value quoted in an error could be that large; a file can be any size. Each is refused with a
short message and exit code 2, and reading it stays bounded (the subprocesses below run under a
2 GiB address-space limit).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvproxy.policies.errors import MAX_PROBLEM_CHARS, MAX_VALUE_CHARS, short_repr
from kvproxy.proxy.config.proxy_config import load_config_and_rules
from kvproxy.proxy.serve.reload import ConfigReloader
from kvproxy.settings.loading import ConfigError
from kvproxy.settings.yaml_file import MAX_FILE_BYTES, read_yaml_with_lines
from tests.harness.reload import reload_once
from tests.harness.yaml_bombs import bomb_lines

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = 'upstream: {bootstrap_servers: ["127.0.0.1:9092"]}\n'
MAX_REPORT_CHARS = 200_000
"""The longest a whole report may get: 100 problems listed at up to 1,000 characters each, the
file name on every line, and the count of the rest."""


def bomb(levels: int, use: str) -> str:
    """A file with an upstream and the bomb."""
    return UPSTREAM + bomb_lines(levels, use)


LIMIT_MEMORY = (
    sys.executable,
    "-c",
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
    "os.execv(sys.argv[1], sys.argv[1:])",
)
"""Run a command within 2 GiB of address space, so that a reader that expands the bomb fails
instead of taking the machine's memory (a preexec_fn is unsafe where tests run threads)."""


def kvproxy_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LIMIT_MEMORY, sys.executable, "-m", "kvproxy.cli", "check", "-c", str(path)],
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_yaml_bomb_is_refused_by_check_with_a_short_error_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "kvproxy.yaml"
    path.write_text(bomb(9, "topics:\n  - match: TOP"))  # 9^9 = 387,420,489 strings
    assert path.stat().st_size < 700
    done = kvproxy_check(path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""
    assert len(done.stderr) < 1000
    # the first list past the bound: a6, on line 9
    assert done.stderr.splitlines() == [
        f"kvproxy: {path}: not valid YAML: line 9, column 12: its aliases expand to more than "
        "1,000,000 values (nested aliases multiply: write the values out, or use fewer levels "
        "of aliases)"
    ]


def test_a_file_over_the_size_limit_is_refused_unread_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "kvproxy.yaml"
    padding = "# a comment line that pads the file\n"
    path.write_text(UPSTREAM + padding * (MAX_FILE_BYTES // len(padding) + 1))
    size = path.stat().st_size
    done = kvproxy_check(path)
    assert done.returncode == 2
    assert done.stderr == (
        f"kvproxy: {path}: too large: {size:,} bytes, the limit is 1,048,576 bytes (a policy "
        "configuration is a few KiB; JSON and Avro schemas go in files of their own)\n"
    )


def test_a_file_without_end_is_read_no_further_than_the_limit() -> None:
    done = kvproxy_check(Path("/dev/zero"))
    assert done.returncode == 2
    assert "/dev/zero: too large: more than 1,048,576 bytes" in done.stderr


def test_a_file_just_under_the_limit_is_read(tmp_path: Path) -> None:
    path = tmp_path / "kvproxy.yaml"
    padding = "# a comment line that pads the file\n"
    path.write_text(UPSTREAM + padding * ((MAX_FILE_BYTES - len(UPSTREAM)) // len(padding)))
    assert path.stat().st_size <= MAX_FILE_BYTES
    data, _ = read_yaml_with_lines(path)
    assert data == {"upstream": {"bootstrap_servers": ["127.0.0.1:9092"]}}


def problems_of(tmp_path: Path, text: str) -> str:
    path = tmp_path / "kvproxy.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config_and_rules(path)
    return str(caught.value)


# Under the alias bound (9^5 = 59,049 strings) but far past any length worth printing.
LARGE = 5


@pytest.mark.parametrize(
    ("use", "says"),
    [
        ("topics:\n  - {match: x, mode: TOP}", "topics[0]: mode must be one of enforce, warn, off"),
        ("topics:\n  - {match: x, compacted: TOP}", "topics[0]: compacted must be true, false"),
        ("topics:\n  - {match: x, policies: [TOP]}", "a policy is a name or a one-key mapping"),
        (
            "topics:\n  - {match: x, policies: [{max_record_bytes: {limit: TOP}}]}",
            "policy max_record_bytes: option limit must be an integer, not [[[[",
        ),
        ("topics:\n  - {match: x, policies: [{acks: {allowed: TOP}}]}", "acks values are"),
        (
            "topics:\n  - {match: x, policies: [{compression: {allowed: TOP}}]}",
            "policy compression: unknown codec [[[[",
        ),
        ("topics:\n  - {match: x, policies: [{timestamps: {type: TOP}}]}", "option type must"),
        ("defaults: {mode: TOP}", "defaults: mode must be one of"),
        ("listen: {host: TOP}", "listen.host: must be a string, not [[[["),
        ("quarantine: {dead_letter_topics: TOP}", "quarantine.dead_letter_topics"),
    ],
)
def test_a_large_value_is_quoted_cut_with_a_count_of_what_was_cut(
    tmp_path: Path, use: str, says: str
) -> None:
    report = problems_of(tmp_path, bomb(LARGE, use))
    assert says in report
    assert len(report) < MAX_REPORT_CHARS
    for line in report.splitlines()[1:]:
        assert len(line) < len(str(tmp_path)) + MAX_PROBLEM_CHARS + 100, line[:300]
    if "[[" in report:  # the value is quoted: its first characters, then what was cut
        assert re.search(r"\.\.\. \((more than )?[\d,]+ more characters\)", report)


def test_a_long_string_is_cut_with_the_exact_count(tmp_path: Path) -> None:
    pattern = "(" * 10_000
    report = problems_of(tmp_path, UPSTREAM + f"topics:\n  - match: '/{pattern}/'\n")
    quoted = repr(f"/{pattern}/")
    assert (
        f"topics[0]: match {quoted[:MAX_VALUE_CHARS]}... "
        f"({len(quoted) - MAX_VALUE_CHARS:,} more characters) is not a valid regular expression"
    ) in report
    assert len(report) < 1000


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            UPSTREAM + "topics: &t\n  - match: x\n    compacted: *t\n",
            "not valid YAML: line 4, column 16: the alias *t is inside its own anchor (a "
            "structure that contains itself)",
        ),
        (
            UPSTREAM + "x: " + "[" * 200 + "]" * 200 + "\n",
            "not valid YAML: line 2, column 103: nested deeper than 100 levels",
        ),
        (
            UPSTREAM + "limits: {max_frame_bytes: " + "9" * 5000 + "}\n",
            "not valid YAML: line 2, column 27: an integer of 5,000 characters (at most 100)",
        ),
        (
            UPSTREAM + "limits: {max_frame_bytes: " + ":".join(["1"] * 5000) + "}\n",
            "not valid YAML: line 2, column 27: an integer of 9,999 characters (at most 100)",
        ),
    ],
)
def test_files_that_would_crash_or_stall_the_reader_are_refused(
    tmp_path: Path, text: str, says: str
) -> None:
    report = problems_of(tmp_path, text)
    assert says in report
    assert len(report) < 1000


@pytest.mark.parametrize(
    ("use", "says"),
    [
        ("topics:\n  - match: '/a{99999999999}/'", "topics[0]: match '/a{99999999999}/' is not a"),
        (
            "topics:\n  - {match: x, policies: [{key_pattern: {regex: 'a{99999999999}'}}]}",
            "policy key_pattern: bad regex 'a{99999999999}': the repetition {99999999999} is over",
        ),
        (
            "quarantine: {dead_letter_topics: ['/a{99999999999}/']}",
            "quarantine.dead_letter_topics: '/a{99999999999}/' is not a valid",
        ),
        ("topics:\n  - match: '/" + "(" * 2000 + "/'", "is not a valid regular expression"),
        (
            "topics:\n  - {match: x, policies: [{key_pattern: {regex: '" + "(" * 2000 + "'}}]}",
            "policy key_pattern: bad regex '((((",
        ),
    ],
)
def test_a_regular_expression_too_large_or_too_deep_is_a_problem_not_a_crash(
    tmp_path: Path, use: str, says: str
) -> None:
    report = problems_of(tmp_path, UPSTREAM + use + "\n")
    assert says in report
    assert len(report) < 2000


def test_a_file_that_is_not_utf8_is_refused_with_the_line(tmp_path: Path) -> None:
    path = tmp_path / "kvproxy.yaml"
    path.write_bytes(UPSTREAM.encode() + b"topics: [\xff]\n")
    with pytest.raises(ConfigError) as caught:
        load_config_and_rules(path)
    assert str(caught.value) == f"{path}: not UTF-8 text: byte 0xff on line 2"


MANY = 5_000


def test_many_problems_are_counted_and_the_report_lists_the_first_hundred(
    tmp_path: Path,
) -> None:
    entries = "".join(f"  - {{matc: t{n}}}\n" for n in range(MANY))
    report = problems_of(tmp_path, UPSTREAM + "topics:\n" + entries)
    lines = report.splitlines()
    assert lines[0].endswith(f"kvproxy.yaml: {2 * MANY} problem(s)")
    assert lines[1].endswith("kvproxy.yaml:3: topics[0].matc: unknown key (did you mean 'match'?)")
    assert lines[-1] == f"  ... and {2 * MANY - 100} more problem(s)"
    assert len(lines) == 102


def test_a_refused_reload_logs_a_bounded_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "kvproxy.yaml"
    path.write_text(UPSTREAM + "listen:\n" + "".join(f"  k{n}: 1\n" for n in range(MANY)))
    server = SimpleNamespace(routing=SimpleNamespace(producer_state=None))
    reloader = ConfigReloader(server, path, poll_interval=0)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="kvproxy.reload"):
        assert asyncio.run(reload_once(reloader)) is False
    # other loggers' records (a finalizer of an earlier test's loop) are not this test's concern
    [record] = [r for r in caplog.records if r.name == "kvproxy.reload"]
    message = record.getMessage()
    assert message.startswith(f"config reload refused: {path}: {MANY} problem(s): line 3: ")
    assert message.endswith(f"; ... and {MANY - 100} more problem(s) (keeping the rules in force)")
    assert len(message) < 100 * MAX_PROBLEM_CHARS


def test_the_audit_refuses_the_bomb_the_same_way(tmp_path: Path) -> None:
    from kvproxy.pipeline.job import AuditError, load_settings

    path = tmp_path / "kvproxy.yaml"
    path.write_text(bomb(9, "errors: {profile: TOP}"))
    with pytest.raises(AuditError) as caught:
        load_settings(str(path), now_ms=0)
    assert "its aliases expand to more than 1,000,000 values" in str(caught.value)
    assert len(str(caught.value)) < 1000


def test_the_audit_quotes_a_large_profile_cut(tmp_path: Path) -> None:
    from kvproxy.pipeline.job import AuditError, load_settings

    path = tmp_path / "kvproxy.yaml"
    path.write_text(bomb(LARGE, "errors: {profile: TOP}"))
    with pytest.raises(AuditError) as caught:
        load_settings(str(path), now_ms=0)
    assert "errors.profile: must be kafka or kip, not [[[[" in str(caught.value)
    assert len(str(caught.value)) < 1000


class TestShortRepr:
    def test_short_values_are_their_repr(self) -> None:
        for value in ["x", 1, None, [1, (2,)], {"a": {1, 2}}, (), set(), frozenset({3}), [[]]]:
            assert short_repr(value) == repr(value)

    def test_a_long_value_is_cut_with_the_count(self) -> None:
        value = [list(range(100))] * 10
        text = repr(value)
        assert short_repr(value, 50) == f"{text[:50]}... ({len(text) - 50:,} more characters)"

    def test_a_structure_that_contains_itself(self) -> None:
        value: list[object] = [1]
        value.append(value)
        assert short_repr(value) == repr(value) == "[1, [...]]"

    def test_any_depth(self) -> None:
        value: list[object] = []
        for _ in range(10_000):
            value = [value]
        assert short_repr(value, 10) == "[" * 10 + "... (19,992 more characters)"

    def test_an_integer_too_long_to_print(self) -> None:
        assert short_repr(10**5000) == "<an integer of 16610 bits>"

    def test_the_count_stops_at_a_budget(self) -> None:
        value = [["lol"] * 9] * 1_000_000  # what nested aliases build: one list, shared
        text = short_repr(value)
        assert text.startswith("[['lol', 'lol'")
        assert text.endswith(" more characters)") and "(more than " in text
        assert len(text) < MAX_VALUE_CHARS + 50


def test_nested_aliases_past_the_bound_are_refused_before_anything_is_built(
    tmp_path: Path,
) -> None:
    """One level more than test_config_errors' line-map file: 5.5 million values."""
    levels = ["a0: &a0 [1, 2, 3, 4, 5]"]
    for n in range(1, 7):
        levels.append(f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 10) + "]")
    path = tmp_path / "aliases.yaml"
    path.write_text("\n".join(levels) + "\n")
    with pytest.raises(ValueError, match="its aliases expand to more than 1,000,000 values"):
        read_yaml_with_lines(path)


def test_a_large_file_without_aliases_is_not_taken_for_a_bomb(tmp_path: Path) -> None:
    """A flow mapping of bare keys holds about a value a byte: a million of them, written out,
    are bounded by the file's size, not by the bound on what aliases add."""
    path = tmp_path / "kvproxy.yaml"
    path.write_text("x: {" + ",".join(f"k{n}" for n in range(120_000)) + "}\n")
    assert path.stat().st_size < MAX_FILE_BYTES
    data, _ = read_yaml_with_lines(path)
    assert data is not None and len(data["x"]) == 120_000
