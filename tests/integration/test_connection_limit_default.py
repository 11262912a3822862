"""An unset `limits.max_connections_per_listener` is what the open file limit has room for, so the
README's development config starts without a warning whatever the limit; a value set too high
for the limit is still warned about.

`kvproxy serve` and `kvproxy check` run as processes whose soft and hard limits on open files
are both 20,000 (a common container runtime's), so that `serve` cannot raise its soft limit.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import yaml

from tests.harness.processes import REPO, kvproxy, kvproxy_serve, wait_until
from tests.harness.proxy import free_port_range
from tests.harness.tansu import free_port

OPEN_FILES = (20_000, 20_000)
ROOM = (20_000 - 256) // 2
"""Two descriptors per client connection, 256 kept for the proxy's own."""
DEV_CONFIG = {"upstream": {"embedded": True}}
"""The README's development config (`printf 'upstream: {embedded: true}\\n' > dev.yaml`)."""


def test_the_readme_has_this_dev_config() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "printf 'upstream: {embedded: true}\\n' > dev.yaml" in readme


def _serve_log(tmp_path: Path, config: dict[str, object]) -> list[str]:
    """What `serve` logs until it is ready, then it is stopped with SIGTERM. The listeners are
    moved off 9192 so that the test does not depend on that port being free."""
    listen = {"port": free_port(), "broker_port_base": free_port_range(100)}
    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump({**config, "listen": listen, "metrics": {"port": 0}}))
    log = tmp_path / "kvproxy.log"
    with kvproxy_serve(path, log, open_files=OPEN_FILES) as proc:

        def ready() -> bool:
            assert proc.poll() is None, log.read_text()
            return "kvproxy ready" in log.read_text()

        wait_until(ready, "kvproxy ready", timeout=60)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(log.read_text()) from None
    return log.read_text().splitlines()


def test_serve_with_the_dev_config_starts_without_a_warning(tmp_path: Path) -> None:
    lines = _serve_log(tmp_path, DEV_CONFIG)
    assert not [line for line in lines if " WARNING " in line or " ERROR " in line], lines
    said = [line for line in lines if "limits.max_connections_per_listener" in line]
    assert len(said) == 1, lines
    assert said[0].endswith(
        f"INFO kvproxy: limits.max_connections_per_listener: {ROOM} (unset: what the open file "
        "limit 20000 has room for, below the default 10000)"
    )


def test_a_connection_limit_set_above_what_the_open_file_limit_allows_is_warned_about(
    tmp_path: Path,
) -> None:
    lines = _serve_log(tmp_path, {**DEV_CONFIG, "limits": {"max_connections_per_listener": 10000}})
    warnings = [line for line in lines if " WARNING " in line]
    assert len(warnings) == 1, lines
    assert warnings[0].endswith(
        f"WARNING kvproxy: open file limit 20000 has room for {ROOM} client connections (two "
        "descriptors each), fewer than limits.max_connections_per_listener (10000): clients can "
        "run the proxy out of file descriptors before that limit refuses them; raise the hard "
        "limit (ulimit -Hn, LimitNOFILE=) or lower the setting"
    )


def test_check_says_where_the_connection_limit_comes_from(tmp_path: Path) -> None:
    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump(DEV_CONFIG))
    done = kvproxy("check", "-c", str(path), open_files=OPEN_FILES)
    assert done.stderr == ""
    assert (
        f"  connections: {ROOM} per listener (unset: what the open file limit 20000 has room "
        "for, below the default 10000), 1000 per client address;"
    ) in done.stdout
