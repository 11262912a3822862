"""The `kvproxy` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from proxy import demo, dump


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvproxy", description="Kafka validation proxy: decode, check and relay Kafka traffic"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo.add_parser(subparsers)
    dump.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
