"""The framework, the proxy and the audit name no built-in policy: what a policy is and does
they read from its declarations (`kvproxy.policies.declaration`), so a built-in can be changed,
renamed or removed in `policies/builtin/` and the entry-point table alone. A string literal
equal to an entry point's name anywhere else under `kvproxy/` is a defect unless it means
something else, as listed here with the reason."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "kvproxy"

OTHER_MEANINGS: dict[tuple[str, str], str] = {
    ("commands/cli.py", "json"): "a log and output format (`--format json`)",
    ("proxy/ops/logs.py", "json"): "the log format `json`",
    ("registry/answers.py", "schema"): "the `schema` field of a schema registry's answer",
    ("commands/demo_registry.py", "schema"): "the `schema` field of a schema registry's answer",
    ("protocol/records/batch.py", "crc"): "the name of a record batch header field",
    ("policies/api.py", "producer_state"): "the value of `Need.PRODUCER_STATE`, a capability",
    ("commands/demo.py", "batch_integrity"): "the demo's configuration, as a user writes it",
    ("commands/demo.py", "crc"): "the demo's configuration, as a user writes it",
    ("commands/demo.py", "schema"): "the demo's configuration, as a user writes it",
}


def builtin_names() -> frozenset[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return frozenset(project["entry-points"]["kvproxy.policies"])


def named_outside_builtin(package: Path = PACKAGE) -> set[tuple[str, str]]:
    """(file, name) for each string literal equal to a built-in's name outside builtin/."""
    names = builtin_names()
    builtin = (package / "policies" / "builtin").resolve()
    found = set()
    for path in package.rglob("*.py"):
        if builtin in path.resolve().parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in names:
                found.add((path.relative_to(package).as_posix(), str(node.value)))
    return found


def test_no_builtin_policy_is_named_outside_policies_builtin() -> None:
    unexplained = sorted(named_outside_builtin() - set(OTHER_MEANINGS))
    assert unexplained == [], (
        "a built-in policy named outside kvproxy/policies/builtin/ (declare the capability on "
        "the policy instead, or list the other meaning of the string here)"
    )


def test_every_other_meaning_listed_is_still_there() -> None:
    """A listed exception the code no longer has is taken off the list, so it excuses nothing."""
    assert sorted(set(OTHER_MEANINGS) - named_outside_builtin()) == []


def test_the_check_finds_a_name_written_in_the_framework(tmp_path: Path) -> None:
    (tmp_path / "policies" / "builtin").mkdir(parents=True)
    (tmp_path / "policies" / "builtin" / "broker.py").write_text('name = "batch_integrity"\n')
    (tmp_path / "proxy").mkdir()
    (tmp_path / "proxy" / "answer.py").write_text(
        'if verdict.policy in {"json", "timestamps"}:\n    message = None\n'
    )
    found = named_outside_builtin(tmp_path)
    assert found == {("proxy/answer.py", "json"), ("proxy/answer.py", "timestamps")}
