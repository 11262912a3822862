"""A page rendered by headless Chromium (Debian's `chromium`, installed by `make test`) at a
given width: a screenshot, and what a script run in the page after load found.

The script's result is read back from the DOM Chromium dumps (`--dump-dom`), so no driver
library is needed."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars")


def chromium() -> str:
    found = shutil.which("chromium")
    assert found is not None, "chromium is not installed: `make test` installs it with apt-get"
    return found


def screenshot(page: Path, png: Path, width: int, height: int) -> None:
    subprocess.run(
        [
            chromium(),
            *CHROMIUM_FLAGS,
            f"--window-size={width},{height}",
            f"--screenshot={png}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )


def run_in_page(page: Path, script: str, width: int, height: int) -> Any:
    """The JSON value `script` leaves in `window.result` once the page has loaded."""
    probe = page.with_suffix(".probe.html")
    wrapper = (
        "<script>window.addEventListener('load', () => {"
        f"{script}\n"
        "const out = document.createElement('pre'); out.id = 'probe-result';"
        "out.textContent = JSON.stringify(window.result); document.body.appendChild(out);"
        "});</script>"
    )
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", wrapper + "</body>"))
    done = subprocess.run(
        [
            chromium(),
            *CHROMIUM_FLAGS,
            f"--window-size={width},{height}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            probe.as_uri(),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = re.search(r'<pre id="probe-result">(.*?)</pre>', done.stdout, re.S)
    assert found is not None, f"the page's script left no result: {done.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))
