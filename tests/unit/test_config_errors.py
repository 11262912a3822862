"""What `kvproxy check` says about a wrong file: every problem at once, each with its line.

The tests run `kvproxy check -c kvproxy.yaml` in the file's folder and compare what a user reads
on stderr, line for line, and the exit code.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvproxy.cli import main
from kvproxy.policies.config import build_routing
from kvproxy.policies.errors import PolicyConfigError
from kvproxy.proxy.serve.reload import ConfigReloader
from tests.harness.reload import reload_once

REPO = Path(__file__).resolve().parents[2]

MIXED = """\
listen:
  prot: 9192
upstream:
  bootstrap_servers: [kafka-1]
limits: 5
defaults:
  mode: enforce
  polices: [crc]
topics:
  - match: orders
    policies:
      - crc
      - jsn
  - matc: payments
    mode: loud
  - match: "/(unclosed/"
    policies: [{max_record_bytes: {limt: 10}}]
"""

MIXED_PROBLEMS = [
    "kvproxy: kvproxy.yaml: 10 problem(s)",
    "  kvproxy.yaml:2: listen.prot: unknown key (did you mean 'port'?)",
    "  kvproxy.yaml:4: upstream.bootstrap_servers: 'kafka-1' is not HOST:PORT",
    "  kvproxy.yaml:5: limits must be a mapping, not a number",
    "  kvproxy.yaml:8: defaults.polices: unknown key (did you mean 'policies'?)",
    "  kvproxy.yaml:13: topics[0].policies[1]: unknown policy 'jsn' (did you mean 'json'?)",
    "  kvproxy.yaml:14: topics[1].matc: unknown key (did you mean 'match'?)",
    "  kvproxy.yaml:14: topics[1]: match is missing",
    "  kvproxy.yaml:15: topics[1]: mode must be one of enforce, warn, off, not 'loud'",
    "  kvproxy.yaml:16: topics[2]: match '/(unclosed/' is not a valid regular expression: "
    "missing ): (unclosed",
    "  kvproxy.yaml:17: topics[2].policies[0]: policy max_record_bytes: unknown option 'limt' "
    "(did you mean 'limit'?)",
]


def check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], text: str
) -> tuple[int, list[str]]:
    """Exit code and stderr lines of `kvproxy check -c kvproxy.yaml` run beside the file."""
    (tmp_path / "kvproxy.yaml").write_text(textwrap.dedent(text))
    monkeypatch.chdir(tmp_path)
    code = main(["check", "-c", "kvproxy.yaml"])
    out, err = capsys.readouterr()
    assert "OK" not in out
    return code, err.splitlines()


def test_every_problem_of_every_section_at_once_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = check(tmp_path, monkeypatch, capsys, MIXED)
    assert lines == MIXED_PROBLEMS
    assert code == 2


def test_serve_refuses_the_same_file_with_the_same_problems(tmp_path: Path) -> None:
    (tmp_path / "kvproxy.yaml").write_text(MIXED)
    done = subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "serve", "-c", "kvproxy.yaml"],
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stderr.splitlines() == MIXED_PROBLEMS
    assert done.returncode == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "upstream: {bootstrap_servers: [k:1]}\ntopics: [{matc: orders}]\n",
            [
                "  kvproxy.yaml:2: topics[0].matc: unknown key (did you mean 'match'?)",
                "  kvproxy.yaml:2: topics[0]: match is missing",
            ],
        ),
        (
            "upstream: {bootstrap_servers: [k:1]}\ndefaults:\n  mode: warn\n  colour: red\n",
            ["  kvproxy.yaml:4: defaults.colour: unknown key (known: mode, policies)"],
        ),
        (
            """\
            upstream: {bootstrap_servers: [k:1]}
            topics:
              - match: orders
                policies:
                  - crc
                  - max_record_bytes:
                      limit: 10
                      batch_limt: 20
                  - custom: {class: "examples.policies:CurrencyPolicy", confg: {}}
            """,
            [
                "  kvproxy.yaml:8: topics[0].policies[1]: policy max_record_bytes: "
                "unknown option 'batch_limt' (did you mean 'batch_limit'?)",
                "  kvproxy.yaml:9: topics[0].policies[2].custom.confg: unknown key "
                "(did you mean 'config'?)",
            ],
        ),
    ],
    ids=["topic-entry", "defaults", "policy-options"],
)
def test_an_unknown_key_is_called_an_unknown_key(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    expected: list[str],
) -> None:
    code, lines = check(tmp_path, monkeypatch, capsys, text)
    assert lines == [f"kvproxy: kvproxy.yaml: {len(expected)} problem(s)", *expected]
    assert code == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("topics: orders\n", "kvproxy.yaml:2: topics must be a list, not a string"),
        ("topics: [orders]\n", "kvproxy.yaml:2: topics[0]: must be a mapping, not a string"),
        ("listen: 5\n", "kvproxy.yaml:2: listen must be a mapping, not a number"),
        ("listen: [a]\n", "kvproxy.yaml:2: listen must be a mapping, not a list"),
        ("limits:\n", "kvproxy.yaml:2: limits must be a mapping, not empty"),
        ("defaults: enforce\n", "kvproxy.yaml:2: defaults must be a mapping, not a string"),
        ("quarantine: {dir: [a]}\n", "kvproxy.yaml:2: quarantine: dir must be a path, not a list"),
        ("listen: {tls: 5}\n", "kvproxy.yaml:2: listen: tls must be a mapping, not a number"),
        (
            "quarantine: {dead_letter_topics: orders}\n",
            "kvproxy.yaml:2: quarantine: dead_letter_topics must be a list, not a string",
        ),
        (
            "listen: {port: abc}\n",
            "kvproxy.yaml:2: listen.port: must be a whole number, not 'abc'",
        ),
        (
            "defaults: {policies: crc}\n",
            "kvproxy.yaml:2: defaults: policies must be a list, not a string",
        ),
    ],
)
def test_a_section_of_the_wrong_type_says_what_it_must_be(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    expected: str,
) -> None:
    code, lines = check(tmp_path, monkeypatch, capsys, "upstream: {embedded: true}\n" + text)
    assert lines == ["kvproxy: kvproxy.yaml: 1 problem(s)", f"  {expected}"]
    assert code == 2


def test_upstream_of_the_wrong_type_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = check(tmp_path, monkeypatch, capsys, "upstream: kafka:9092\n")
    assert lines == [
        "kvproxy: kvproxy.yaml: 1 problem(s)",
        "  kvproxy.yaml:1: upstream must be a mapping, not a string",
    ]
    assert code == 2


def test_a_missing_key_is_reported_at_the_mapping_that_lacks_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = """\
    # the proxy's configuration
    listen:
      tls:
        cert_file: proxy.pem
    topics:
      - mode: warn
    """
    code, lines = check(tmp_path, monkeypatch, capsys, text)
    assert lines == [
        "kvproxy: kvproxy.yaml: 3 problem(s)",
        "  kvproxy.yaml:2: upstream is missing",
        "  kvproxy.yaml:3: listen.tls: key_file is missing",
        "  kvproxy.yaml:6: topics[0]: match is missing",
    ]
    assert code == 2


def test_a_custom_class_that_cannot_be_imported_is_reported_at_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = """\
    upstream: {bootstrap_servers: [k:1]}
    topics:
      - match: payments
        policies:
          - custom:
              class: no_such_module_kvproxy:Policy
      - match: orders
        policies: [json, {json_schema: {value: missing.json}}]
    """
    code, lines = check(tmp_path, monkeypatch, capsys, text)
    assert lines == [
        "kvproxy: kvproxy.yaml: 2 problem(s)",
        "  kvproxy.yaml:6: topics[0].policies[0]: custom class no_such_module_kvproxy:Policy: "
        "cannot import no_such_module_kvproxy: No module named 'no_such_module_kvproxy'",
        "  kvproxy.yaml:8: topics[1].policies[1]: policy json_schema: option value: no such file "
        f"{tmp_path.resolve() / 'missing.json'}",
    ]
    assert code == 2


def test_a_good_file_is_still_ok(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "kvproxy.yaml").write_text(
        "upstream: {bootstrap_servers: [k:1]}\ntopics: [{match: orders, policies: [crc]}]\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["check", "-c", "kvproxy.yaml"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "kvproxy.yaml: OK"
    assert (
        "    orders: mode enforce, compacted from the cluster, policies: batch_integrity, crc, "
        "timestamps, compacted_key; default policies kept" in out
    )
    assert err == ""


# ---- the same problems elsewhere: the policy API (Spark audit) and hot reload ----


def test_build_routing_collects_every_problem() -> None:
    with pytest.raises(PolicyConfigError) as caught:
        build_routing(
            {"polices": ["crc"]},
            [{"matc": "a"}, {"match": "b", "policies": ["jsn", {"crc": {"x": 1}}]}],
            Path("."),
        )
    problems = [str(problem) for problem in caught.value.problems]
    assert problems == [
        "defaults.polices: unknown key (did you mean 'policies'?)",
        "topics[0].matc: unknown key (did you mean 'match'?)",
        "topics[0]: match is missing",
        "topics[1].policies[0]: unknown policy 'jsn' (did you mean 'json'?)",
        "topics[1].policies[1]: policy crc: unknown option 'x' (known: none)",
    ]
    assert str(caught.value) == "; ".join(problems)


def test_build_routing_shows_a_policy_error_inherited_from_defaults_once() -> None:
    with pytest.raises(PolicyConfigError) as caught:
        build_routing({"policies": ["jsn"]}, [{"match": "a"}, {"match": "b"}], Path("."))
    assert str(caught.value) == "defaults.policies[0]: unknown policy 'jsn' (did you mean 'json'?)"


def test_a_refused_reload_names_every_problem_on_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "kvproxy.yaml"
    path.write_text(
        "upstream: {bootstrap_servers: [k:1]}\n"
        "listen: {prot: 1}\n"
        "topics:\n"
        "  - match: orders\n"
        "    policies: [jsn]\n"
    )
    server = SimpleNamespace(routing=SimpleNamespace(producer_state=None))
    reloader = ConfigReloader(server, path, poll_interval=0)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="kvproxy.reload"):
        assert asyncio.run(reload_once(reloader)) is False
    [record] = [r for r in caplog.records if r.name == "kvproxy.reload"]
    assert record.getMessage() == (
        f"config reload refused: {path}: 2 problem(s): "
        "line 2: listen.prot: unknown key (did you mean 'port'?); "
        "line 5: topics[0].policies[0]: unknown policy 'jsn' (did you mean 'json'?) "
        "(keeping the rules in force)"
    )


def test_the_audit_reports_the_same_file_by_line_and_all_at_once(tmp_path: Path) -> None:
    """`kvproxy audit -c FILE` reads the policy sections of the proxy's file: its problems come
    with their lines too, all of them in one pass."""
    from kvproxy.pipeline.job import AuditError, load_settings

    config = tmp_path / "kvproxy.yaml"
    config.write_text(
        "upstream: {bootstrap_servers: ['k:9092']}\n"
        "errors: {profile: kap}\n"
        "topics:\n"
        "  - match: orders\n"
        "    policies: [crc, {max_record_bytes: {limit: lots}}]\n"
        "  - matc: payments\n"
    )
    with pytest.raises(AuditError) as caught:
        load_settings(str(config), now_ms=0)
    assert str(caught.value).splitlines() == [
        f"{config}: 4 problem(s)",
        f"  {config}:2: errors.profile: must be kafka or kip, not 'kap'",
        f"  {config}:5: topics[0].policies[1]: policy max_record_bytes: option limit must be an "
        "integer, not 'lots'",
        f"  {config}:6: topics[1].matc: unknown key (did you mean 'match'?)",
        f"  {config}:6: topics[1]: match is missing",
    ]


def test_nested_aliases_do_not_multiply_the_line_map(tmp_path: Path) -> None:
    """Aliases of aliases name each node many times (5 x 10^5 paths here, within the bound on
    expanded values): the lines are walked once per node, so such a file costs what its text
    costs."""
    from kvproxy.settings.yaml_file import read_yaml_with_lines

    levels = ["a0: &a0 [1, 2, 3, 4, 5]"]
    for n in range(1, 6):
        levels.append(f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 10) + "]")
    path = tmp_path / "aliases.yaml"
    path.write_text("\n".join(levels) + "\n")
    _, lines = read_yaml_with_lines(path)
    assert len(lines) < 100
