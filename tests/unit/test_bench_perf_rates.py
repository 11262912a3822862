"""`bench/perf_rates.py` without a broker: medians per rate and side, and kvproxy against
HAProxy on the small-request goals (CPU per request at most 2x, p50 at most +0.2 ms, p99 at
most +2 ms), from runs as the tool reports them (whole-millisecond percentiles, 0 included)."""

from __future__ import annotations

from bench.perf_rates import RateRun, report, summarize


def run(side: str, rnd: int, *, avg: float, p50: float, p99: float, cpu: float | None) -> RateRun:
    return RateRun(
        side=side,
        rate=5000,
        round=rnd,
        records=100_000,
        records_per_s=5000.0,
        avg_ms=avg,
        p50_ms=p50,
        p99_ms=p99,
        max_ms=80.0,
        relay_cpu_us_per_record=cpu,
        requests_per_record=1.0 if side == "proxy" else None,
        compiled_share=0.5 + rnd / 4 if side == "proxy" else None,
    )


RUNS = [
    *(run("direct", n, avg=0.8, p50=0, p99=17, cpu=None) for n in (1, 2, 3)),
    *(run("haproxy", n, avg=0.9 + n / 100, p50=0, p99=19, cpu=6.0 + n) for n in (1, 2, 3)),
    run("proxy", 1, avg=1.0, p50=1, p99=16, cpu=12.0),
    run("proxy", 2, avg=1.1, p50=0, p99=20, cpu=13.0),
    run("proxy", 3, avg=1.5, p50=1, p99=30, cpu=30.0),
]


def test_the_medians_keep_a_p50_of_zero_and_a_side_without_a_relay() -> None:
    sides = summarize(RUNS)[5000]["sides"]
    assert sides["direct"]["p50_ms"] == 0
    assert sides["direct"]["relay_cpu_us_per_record"] is None
    assert sides["haproxy"]["relay_cpu_us_per_record"] == 8.0
    assert sides["proxy"] == {
        "avg_ms": 1.1,
        "p50_ms": 1,
        "p99_ms": 20,
        "relay_cpu_us_per_record": 13.0,
        "requests_per_record": 1.0,
        "relay_system_share": None,
        "compiled_share": 1.0,  # the median of 0.75, 1.0 and 1.25
    }


def test_kvproxy_is_held_to_haproxy_on_each_goal() -> None:
    goals = summarize(RUNS)[5000]["goals"]
    assert goals["cpu_ratio"] == 13.0 / 8.0 and goals["cpu_met"]
    assert goals["p50_added_ms"] == 1 and not goals["p50_met"]
    assert goals["p99_added_ms"] == 1 and goals["p99_met"]
    assert round(goals["avg_added_ms"], 2) == 0.18


def test_the_report_says_which_goal_is_not_met() -> None:
    lines = report(summarize(RUNS))
    assert lines[-1].startswith("   5000 kvproxy / HAProxy: CPU 1.62x (goal <= 2x: met)")
    assert "p50 +1.00 ms (<= +0.2: NOT MET" in lines[-1]
