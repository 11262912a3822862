"""`kvproxy`: the proxy's commands (serve, check, demo, dump, quarantine, topics) and `audit`.

The layers never import each other; this is the one place that puts their commands together.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from proxy.signals import queue_sighup


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] == ["serve"]:
        queue_sighup()  # before the seconds of imports below: a SIGHUP then must not kill serve
    from pipeline import cli as pipeline_cli  # noqa: PLC0415
    from proxy import cli as proxy_cli  # noqa: PLC0415

    return proxy_cli.main(argv, extra_commands=(pipeline_cli.add_parser,))


if __name__ == "__main__":
    sys.exit(main())
