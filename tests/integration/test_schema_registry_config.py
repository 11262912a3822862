"""The `schema_registry` section as a user meets it: `kvproxy check` (with and without
--connect), the errors of a wrong section, and a reload that would need a registry the running
proxy does not have. The registry is the stand-in of `tests/harness/schema_registry.py`."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kvproxy.cli import main
from kvproxy.proxy.serve.reload import ConfigReloader
from tests.harness import Broker
from tests.harness.proxy import run_proxy
from tests.harness.reload import reload_once
from tests.harness.schema_registry import TestRegistry

SCHEMA_RULE = (
    "topics:\n  - {match: orders, default_policies: drop, "
    "policies: [{schema: {value: required}}]}\n"
)


@pytest.fixture
def registry() -> Iterator[TestRegistry]:
    with TestRegistry(basic_auth=("kv", "secret")) as running:
        yield running


def _check(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    *args: str,
) -> tuple[int, str, str]:
    (tmp_path / "kvproxy.yaml").write_text(textwrap.dedent(text))
    monkeypatch.chdir(tmp_path)
    code = main(["check", "-c", "kvproxy.yaml", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _file(url: str, password: str = "${REGISTRY_PASSWORD}") -> str:
    return (
        "upstream: {embedded: true}\n"
        f"schema_registry:\n  url: {url}\n"
        f"  basic_auth: {{username: kv, password: '{password}'}}\n"
        "  timeout_ms: 500\n" + SCHEMA_RULE
    )


def test_check_describes_the_registry_and_connect_asks_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    registry: TestRegistry,
) -> None:
    monkeypatch.setenv("REGISTRY_PASSWORD", "secret")
    code, out, _err = _check(tmp_path, monkeypatch, capsys, _file(registry.url))
    assert code == 0
    assert (
        f"schema registry: {registry.url} (basic auth), 500 ms per request, answers kept "
        "300000 ms (failures 5000 ms) for up to 10000 ids, on_error reject"
    ) in out
    assert "secret" not in out
    assert "orders: mode enforce, compacted from the cluster, policies: schema" in out

    code, out, _err = _check(tmp_path, monkeypatch, capsys, _file(registry.url), "--connect")
    assert code == 0, out
    assert f"    {registry.url}: ok (" in out

    monkeypatch.setenv("REGISTRY_PASSWORD", "wrong")
    code, out, err = _check(tmp_path, monkeypatch, capsys, _file(registry.url), "--connect")
    assert code == 1
    assert f"    {registry.url}: refused: HTTP 401 (error 401): Unauthorized" in out
    assert "kvproxy: the schema registry did not answer on every URL" in err

    registry.fail = "down"
    monkeypatch.setenv("REGISTRY_PASSWORD", "secret")
    code, out, err = _check(tmp_path, monkeypatch, capsys, _file(registry.url), "--connect")
    assert code == 1
    assert f"    {registry.url}: unreachable: ConnectError" in out


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        (
            "",
            "kvproxy.yaml:3: topics[0]: the schema policy needs a schema_registry section "
            "(its url at least)",
        ),
        (
            "schema_registry: {url: 'ftp://registry'}\n",
            "kvproxy.yaml:2: schema_registry.url: 'ftp://registry' is not an "
            "http:// or https:// URL",
        ),
        (
            "schema_registry:\n  url: http://r:8081\n  bearer_token: t\n"
            "  basic_auth: {username: u, password: p}\n",
            "kvproxy.yaml:2: schema_registry: basic_auth and bearer_token: set one, not both",
        ),
        (
            "schema_registry:\n  url: http://r:8081\n  bearer_token: ${NO_SUCH_VARIABLE_HERE}\n",
            "kvproxy.yaml:4: schema_registry.bearer_token: environment variable "
            "NO_SUCH_VARIABLE_HERE is not set",
        ),
        (
            "schema_registry: {url: 'http://r:8081', cache_ttl_ms: 10}\n",
            "kvproxy.yaml:2: schema_registry.cache_ttl_ms: must be at least 1000, not 10",
        ),
    ],
)
def test_a_wrong_section_is_named_by_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    section: str,
    problem: str,
) -> None:
    text = "upstream: {embedded: true}\n" + section + SCHEMA_RULE
    code, _out, err = _check(tmp_path, monkeypatch, capsys, text)
    assert code == 2
    assert f"  {problem}" in err.splitlines(), err


def test_a_reload_cannot_add_a_registry_to_a_running_proxy(tansu: Broker, tmp_path: Path) -> None:
    config = tmp_path / "kvproxy.yaml"
    results: list[str] = []
    with run_proxy(tansu.bootstrap) as proxy:
        base = proxy.config.model_dump(mode="json", include={"listen", "upstream"})
        text = yaml.safe_dump(
            {
                **base,
                "schema_registry": {"url": "http://127.0.0.1:9"},
                "topics": [
                    {"match": "orders", "default_policies": "drop", "policies": [{"schema": {}}]}
                ],
            }
        )
        config.write_text(text)
        first = proxy.server.routing

        async def reload() -> bool:
            reloader = ConfigReloader(
                proxy.server, config, poll_interval=0, on_result=results.append, retire_grace=0
            )
            return await reload_once(reloader)

        assert not proxy.call(reload())
        assert proxy.server.routing is first
    assert results == ["failure"]
