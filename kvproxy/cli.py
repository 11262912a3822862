"""`kvproxy`: the proxy's commands (serve, check, demo, dump, quarantine, topics) and `audit`.

The layers never import each other; this is the one place that puts their commands together:
each contributes its subcommands (`add_commands`), and a configuration error of any of them
exits 2 with its message.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata

from kvproxy.proxy.serve.signals import queue_sighup


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: the proxy's subcommands, then the audit's."""
    from kvproxy.commands import cli as commands_cli  # noqa: PLC0415
    from kvproxy.pipeline import cli as pipeline_cli  # noqa: PLC0415

    parser = argparse.ArgumentParser(
        prog="kvproxy", description="Kafka validation proxy: decode, check and relay Kafka traffic"
    )
    # The installed distribution's version, so that it cannot drift from what pip installed.
    try:
        version = metadata.version("kafka-validation-proxy")
    except metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    parser.add_argument("--version", action="version", version=f"%(prog)s {version}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands_cli.add_commands(subparsers)
    pipeline_cli.add_commands(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] == ["serve"]:
        queue_sighup()  # before the seconds of imports below: a SIGHUP then must not kill serve
    from kvproxy.settings.loading import ConfigError  # noqa: PLC0415

    args = build_parser().parse_args(arguments)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"kvproxy: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
