"""Timing CPU-bound work in this process (bench/engine.py, bench/schema.py): loops sized to a
length, one timing of every task per round, and cProfile's view of a task."""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Seconds per call: the best and the median of the repeated timings."""

    best: float
    median: float
    calls: int
    """Calls per timing (in the last round)."""
    shortest: float
    """Seconds the shortest timing took (the whole loop)."""


def calibrate(fn: Callable[[], object], seconds: float) -> int:
    """Warm `fn` up and size its loop so that one timing takes at least `seconds`.

    The loop is doubled until it takes an eighth of `seconds`, then one loop of about half of
    `seconds` (by then warm: a cold first call would make the estimate too short) sets the size,
    with a tenth to spare.
    """
    calls = 1
    while True:
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - started
        if elapsed >= seconds / 8:
            break
        calls *= 2
    calls = max(1, math.ceil(calls * seconds / 2 / elapsed))
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - started
    return max(1, math.ceil(calls * seconds * 1.1 / elapsed))


def time_rounds(
    tasks: Mapping[str, Callable[[], object]], *, seconds: float, repeats: int
) -> dict[str, Timing]:
    """One timing of every task per round, `repeats` rounds: a slow spell of the shared machine
    then hits an engine figure and its limit alike, instead of whichever ran during it."""
    calls = {name: calibrate(fn, seconds) for name, fn in tasks.items()}
    samples: dict[str, list[float]] = {name: [] for name in tasks}
    shortest: dict[str, float] = {}
    for round_index in range(repeats):
        for name, fn in tasks.items():
            n = calls[name]
            started = time.perf_counter()
            for _ in range(n):
                fn()
            elapsed = time.perf_counter() - started
            samples[name].append(elapsed / n)
            shortest[name] = min(shortest.get(name, elapsed), elapsed)
            if elapsed < seconds:  # sized in a slow spell: longer from the next round on
                calls[name] = math.ceil(n * seconds * 1.1 / elapsed)
        print(f"  round {round_index + 1}/{repeats} done", flush=True)
    return {
        name: Timing(min(times), statistics.median(times), calls[name], shortest[name])
        for name, times in samples.items()
    }


def profile(
    tasks: dict[str, Callable[[], None]], seconds: float, names: Sequence[str]
) -> dict[str, str]:
    """cProfile's top 12 functions by own time, for each task of `names`."""
    out: dict[str, str] = {}
    for name in names:
        fn = tasks[name]
        calls = calibrate(fn, seconds)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            fn()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
        out[name] = text.getvalue()
        print(f"== {name}: {calls} calls ==")
        print(out[name])
    return out


def timing_arguments(doc: str | None, argv: list[str] | None) -> argparse.Namespace:
    """The options of a timing benchmark (`--quick`, `--seconds`, `--repeats`, `--profile`),
    with the lengths `--quick` stands for filled in."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
    parser.add_argument("--quick", action="store_true", help="0.02 s timings, 3 rounds")
    parser.add_argument("--seconds", type=float, default=None, help="length of one timing")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (the best is kept)")
    parser.add_argument("--profile", action="store_true", help="only print cProfile's top lines")
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = 0.02 if args.quick else 0.2
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    return args
