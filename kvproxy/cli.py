"""`kvproxy`: the proxy's commands (serve, check, demo, dump, quarantine) and `audit`.

The layers never import each other; this is the one place that puts their commands together.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pipeline import cli as pipeline_cli
from proxy import cli as proxy_cli


def main(argv: Sequence[str] | None = None) -> int:
    return proxy_cli.main(argv, extra_commands=(pipeline_cli.add_parser,))


if __name__ == "__main__":
    sys.exit(main())
