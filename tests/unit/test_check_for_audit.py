"""`kvproxy check --for audit`: a file written only for backtesting (no `upstream`) is checked
as `kvproxy audit` reads it; without the option, `check` says which option that is."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvproxy.cli import main

AUDIT_ONLY = "topics:\n  - {match: orders, default_policies: drop, policies: [crc, {json: {}}]}\n"


def _check(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    *args: str,
) -> tuple[int, str, str]:
    (tmp_path / "audit.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    code = main(["check", "-c", "audit.yaml", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_audit_only_file_is_ok_for_the_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _err = _check(tmp_path, monkeypatch, capsys, AUDIT_ONLY, "--for", "audit")
    assert code == 0
    assert out.splitlines()[:2] == [
        "audit.yaml: OK for kvproxy audit (its other sections are the proxy's, unchecked)",
        "  errors.profile: kafka",
    ]
    assert "    orders: mode enforce, compacted from the cluster, policies: crc, json" in out


def test_serve_names_the_option_for_an_audit_only_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = _check(tmp_path, monkeypatch, capsys, AUDIT_ONLY)
    assert code == 2
    assert err.splitlines()[1:] == [
        "  audit.yaml:1: upstream is missing",
        "  (a file only for `kvproxy audit`? `kvproxy check --for audit -c audit.yaml` checks "
        "what the audit reads)",
    ]


def test_the_audit_reading_reports_every_problem_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        "errors: {profile: kipp}\n"
        "schema_registry: {url: 'ftp://r'}\n"
        "topics:\n  - {match: orders, policies: [crcc]}\n"
    )
    code, _out, err = _check(tmp_path, monkeypatch, capsys, text, "--for", "audit")
    assert code == 2
    assert err.splitlines() == [
        "kvproxy: audit.yaml: 3 problem(s)",
        "  audit.yaml:1: errors.profile: must be kafka or kip, not 'kipp'",
        "  audit.yaml:2: schema_registry.url: 'ftp://r' is not an http:// or https:// URL",
        "  audit.yaml:4: topics[0].policies[0]: unknown policy 'crcc' (did you mean 'crc'?)",
    ]
