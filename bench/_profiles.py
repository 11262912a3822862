"""Where a running relay spends its CPU during a measured run: py-spy samples its stacks (only
while it holds the GIL, so waiting in the event loop's select is not counted) into a folded file
of `frame;frame;... count` lines, summed here by frame (self and inclusive). py-spy stops the
process for each sample (its default): sampling without stopping it (`--nonblocking`) was seen
to favour frames inside a system call, giving the write calls shares the system time denies."""

from __future__ import annotations

import collections
import contextlib
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

RATE = 250
"""Samples a second: enough for a few thousand over a 10 s run, at a small cost to the relay."""


def py_spy() -> str:
    """The py-spy of this environment (a `bench` extra)."""
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise RuntimeError("py-spy is not installed: pip install -e '.[bench]'")
    return found


@contextlib.contextmanager
def sampling(pid: int, output: Path) -> Iterator[None]:
    """Sample `pid` into `output` (folded stacks) while the block runs."""
    spy = subprocess.Popen(
        [py_spy(), "record", "--pid", str(pid), "--format", "raw", "--rate", str(RATE),
         "--gil", "--nolineno", "--output", str(output)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled on SIGINT
        try:
            spy.wait(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()


def frame_totals(folded: Path) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """Per frame: samples in which it is the innermost (self), samples in which it is anywhere
    on the stack (inclusive, counted once a sample), and the samples in all."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in folded.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return own, inclusive, total


def profile_lines(folded: Path, top: int = 25) -> list[str]:
    """The frames with the most samples, inclusive and self, as shares of all samples."""
    own, inclusive, total = frame_totals(folded)
    if not total:
        return [f"{folded.name}: no samples"]
    lines = [f"{folded.name}: {total} samples holding the GIL", "  inclusive:"]
    lines += [f"    {n / total:6.1%}  {frame}" for frame, n in inclusive.most_common(top)]
    lines.append("  self:")
    lines += [f"    {n / total:6.1%}  {frame}" for frame, n in own.most_common(top)]
    return lines
