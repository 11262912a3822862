"""A file's syntax errors and wrong values in kvproxy's words: the file, the line (and column),
the key's path and the value given, never pydantic's or PyYAML's own phrasing."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kvproxy.cli import main
from kvproxy.settings.loading import Section, read_document, report, validate


def check_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], text: str
) -> tuple[int, list[str]]:
    """Exit code and stderr lines of `kvproxy check -c kvproxy.yaml` run beside the file."""
    (tmp_path / "kvproxy.yaml").write_text(textwrap.dedent(text))
    monkeypatch.chdir(tmp_path)
    code = main(["check", "-c", "kvproxy.yaml"])
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "upstream: {bootstrap_servers: [k:1]\n",
            "line 2, column 1: expected ',' or '}', found the end of the file (in the {...} "
            "mapping opened on line 1, column 11)",
        ),
        (
            "upstream:\n  embedded: true\n connect_timeout_ms: 5\n",
            "line 3, column 2: a line indented differently from the lines beside it: found a key "
            "indented more than the one before it (in the mapping starting on line 1, column 1)",
        ),
        (
            "upstream:\n\tembedded: true\n",
            "line 2, column 1: a tab: YAML indents with spaces",
        ),
        (
            "upstream: {embedded: true}\nlisten: {host: 'localhost}\n",
            "line 3, column 1: the file ends before the closing quote (in the quoted string "
            "starting on line 2, column 16)",
        ),
        (
            "upstream: {embedded: true}\nlisten: host: localhost\n",
            "line 2, column 13: a ':' where no key can start: quote a value that holds ': ', or "
            "indent the key as the keys beside it",
        ),
        (
            "upstream: {embedded: true}\ntopics: [{match: a}\n",
            "line 3, column 1: expected ',' or ']', found the end of the file (in the [...] list "
            "opened on line 2, column 9)",
        ),
        (
            "upstream: {embedded: true}\ndefaults: *base\n",
            "line 2, column 11: the alias *base names no anchor &base written before it",
        ),
        (
            "upstream: {embedded: true}\nlisten: {host: @local}\n",
            "line 2, column 16: '@' cannot start a value: quote the value",
        ),
    ],
)
def test_a_syntax_error_names_the_file_line_and_column_in_plain_words(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    expected: str,
) -> None:
    code, lines = check_stderr(tmp_path, monkeypatch, capsys, text)
    assert lines == [f"kvproxy: kvproxy.yaml: not valid YAML: {expected}"]
    assert code == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("listen: {port: abc}\n", "kvproxy.yaml:2: listen.port: must be a whole number, not 'abc'"),
        ("listen: {port: 1.5}\n", "kvproxy.yaml:2: listen.port: must be a whole number, not 1.5"),
        (
            "listen:\n  port_per_broker: maybe\n",
            "kvproxy.yaml:3: listen.port_per_broker: must be true or false, not 'maybe'",
        ),
        ("listen: {host: 5}\n", "kvproxy.yaml:2: listen.host: must be a string, not 5"),
        (
            "quarantine: {dead_letter_topics: [orders, 7]}\n",
            "kvproxy.yaml:2: quarantine.dead_letter_topics[1]: must be a string, not 7",
        ),
        ("reject: topic\n", "kvproxy.yaml:2: reject: must be partition or request, not 'topic'"),
        (
            "errors: {profile: confluent}\n",
            "kvproxy.yaml:2: errors.profile: must be kafka or kip, not 'confluent'",
        ),
        (
            "limits:\n  max_frame_bytes: 5\n",
            "kvproxy.yaml:3: limits.max_frame_bytes: must be at least 1024, not 5",
        ),
        (
            "listen: {max_brokers: 20000}\n",
            "kvproxy.yaml:2: listen.max_brokers: must be at most 10000, not 20000",
        ),
        (
            "listen: {sni: {port: 9443, bootstrap: k.example, brokers: b.example}}\n",
            "kvproxy.yaml:2: listen.sni.brokers: 'b.example' must hold $(nodeId) exactly once "
            "(where the node id goes)",
        ),
    ],
)
def test_a_value_of_the_wrong_type_is_named_with_its_key_path_and_value(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    expected: str,
) -> None:
    code, lines = check_stderr(tmp_path, monkeypatch, capsys, "upstream: {embedded: true}\n" + text)
    assert lines == ["kvproxy: kvproxy.yaml: 1 problem(s)", f"  {expected}"]
    assert code == 2


def test_a_secret_of_the_wrong_type_is_named_but_not_quoted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "upstream:\n  bootstrap_servers: [k:1]\n  tls: {key_password: 80417}\n"
    code, lines = check_stderr(tmp_path, monkeypatch, capsys, text)
    assert lines == [
        "kvproxy: kvproxy.yaml: 1 problem(s)",
        "  kvproxy.yaml:3: upstream.tls.key_password: must be a string, not a number",
    ]
    assert code == 2


class _Rates(Section):
    ratio: float = 0.5
    name: str = "x"


def test_a_float_a_missing_key_and_an_unknown_key_in_the_same_words(tmp_path: Path) -> None:
    class Outer(Section):
        rates: _Rates
        label: str

    path = tmp_path / "f.yaml"
    path.write_text("rates:\n  ratio: half\n  nmae: y\n")
    data, lines = read_document(path)
    model, problems = validate(Outer, data)
    assert model is None
    assert str(report(str(path), problems, lines)).splitlines() == [
        f"{path}: 3 problem(s)",
        f"  {path}:1: label is missing",
        f"  {path}:2: rates.ratio: must be a number, not 'half'",
        f"  {path}:3: rates.nmae: unknown key (did you mean 'name'?)",
    ]
