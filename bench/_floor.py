"""The against-the-floor rows of the network benchmarks: kvproxy against HAProxy in TCP mode (the
goals), kvproxy against the uvloop relay and the relay against HAProxy, from the same run, and
their table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench._results import median

KVPROXY = "kvproxy"
HAPROXY = "HAProxy"
UVLOOP_RELAY = "uvloop relay"
SIDE_NAMES = {"proxy": KVPROXY, "haproxy": HAPROXY, "uvloop": UVLOOP_RELAY}
"""The names in the against-the-floor rows of the benchmarks' sides."""


@dataclass(frozen=True)
class FloorRow:
    """One side against a floor on one figure from the same run (kvproxy against HAProxy, the
    goals; kvproxy against the uvloop relay; the uvloop relay against HAProxy): both readings, how
    they compare (measured / floor, or measured - floor for latencies), round by round, the goal."""

    figure: str
    measured: str
    floor: str
    measured_reading: float
    floor_reading: float
    comparison: str
    """"ratio" (measured / floor) or "difference" (measured - floor)."""
    value: float
    per_round: tuple[float, ...]
    goal: str | None
    met: bool | None


def against_floor(
    figure: str,
    floor_readings: Sequence[float],
    measured_readings: Sequence[float],
    *,
    at_most: float | None = None,
    at_least: float | None = None,
    measured: str = KVPROXY,
    floor: str = HAPROXY,
) -> FloorRow:
    """The measured side's median over the floor's median of one figure, with the ratio of each
    round's pair (the runs of one round were measured next to each other)."""
    pairs = zip(measured_readings, floor_readings, strict=True)
    return _floor_row(
        figure,
        (measured, floor),
        (median(measured_readings), median(floor_readings)),
        comparison="ratio",
        value=median(measured_readings) / median(floor_readings),
        per_round=[m / f for m, f in pairs],
        at_most=at_most,
        at_least=at_least,
    )


def floor_difference(
    figure: str,
    floor_reading: float,
    measured_reading: float,
    per_round: Sequence[float],
    *,
    at_most: float | None = None,
    measured: str = KVPROXY,
    floor: str = HAPROXY,
) -> FloorRow:
    """Measured - floor of one figure (a latency percentile), with the differences per round."""
    return _floor_row(
        figure,
        (measured, floor),
        (measured_reading, floor_reading),
        comparison="difference",
        value=measured_reading - floor_reading,
        per_round=per_round,
        at_most=at_most,
        at_least=None,
    )


def _floor_row(
    figure: str,
    sides: tuple[str, str],
    readings: tuple[float, float],
    *,
    comparison: str,
    value: float,
    per_round: Sequence[float],
    at_most: float | None,
    at_least: float | None,
) -> FloorRow:
    sign = "+" if comparison == "difference" else ""
    if at_most is not None:
        goal, met = f"<= {sign}{at_most:g}", value <= at_most
    elif at_least is not None:
        goal, met = f">= {sign}{at_least:g}", value >= at_least
    else:
        goal, met = None, None
    rounds = tuple(per_round)
    return FloorRow(figure, *sides, *readings, comparison, value, rounds, goal, met)


def _reading(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def floor_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Lines of a table of FloorRow fields (as written to a results file)."""
    lines = [
        f"{'':44}{'measured / floor':24}{'floor':>9}{'measured':>9}{'compared':>10}{'goal':>9}"
        f"{'met':>5}  per round",
    ]
    for row in rows:
        difference = row["comparison"] == "difference"
        sides = f"{row['measured']} {'-' if difference else '/'} {row['floor']}"
        value = f"{row['value']:+.3f}" if difference else f"{row['value']:.2f}x"
        rounds = " ".join(f"{x:+.3f}" if difference else f"{x:.2f}" for x in row["per_round"])
        met = "-" if row["met"] is None else ("yes" if row["met"] else "NO")
        lines.append(
            f"{row['figure']:44}{sides:24}{_reading(row['floor_reading']):>9}"
            f"{_reading(row['measured_reading']):>9}{value:>10}{row['goal'] or '-':>9}{met:>5}"
            f"  {rounds}".rstrip()
        )
    return lines


def print_floor(rows: Sequence[FloorRow]) -> None:
    """The against-the-floor table of one benchmark."""
    floors = "HAProxy TCP mode"
    if any(UVLOOP_RELAY in (row.measured, row.floor) for row in rows):
        floors += "; the uvloop relay: a Python relay reading nothing"
    print(f"\nagainst the floor ({floors}; same run)")
    print("compared = measured / floor, or measured - floor in ms for latencies")
    print("\n".join(floor_table([asdict(row) for row in rows])))
