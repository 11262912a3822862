"""Instruction counts of the Produce hot path on fixed inputs: a regression check that a noisy
machine cannot fool.

Times on these shared machines move by tens of percent from one run to the next; the number of
instructions the interpreter executes for the same work on the same inputs does not. Each case
runs a fixed request through the calls the proxy makes per Produce request (`read_unless_many`,
`ProduceEngine.decide` with an inline allowance, then `ProduceExchange.merged` on the broker's
answer) under valgrind's callgrind, counting instructions executed (Ir) in the loop only:

- valgrind starts with instrumentation off (`--instr-atstart=no`): importing and building the
  inputs run at valgrind's plain speed and are never counted;
- each case is warmed up (the interpreter specialises its bytecode in the first runs), then the
  process switches instrumentation on for itself (`vgdb ... instrumentation on`);
- each case's loop runs inside one `functools.reduce` call, and callgrind collects only inside
  that C function (`--toggle-collect=functools_reduce`) and writes one profile as it returns
  (`--dump-after`), so each profile holds exactly one case; the garbage collector is off during
  the loop (collect before): a collection's timing depends on what ran before, not on the case.

The inputs are built in the process, deterministically: keyed records of exactly 1 KiB (10-byte
key, 1014-byte JSON value from a seeded generator), every timestamp and the decision's clock
fixed at 2026-01-01T00:00:00Z, PYTHONHASHSEED=0.

    .venv/bin/python -m bench.instructions            # measure and print, Ir per iteration
    .venv/bin/python -m bench.instructions --check    # compare with bench/instructions.json
    .venv/bin/python -m bench.instructions --write    # refresh bench/instructions.json
    .venv/bin/python -m bench.instructions --repeat 3 # the spread of 3 whole runs

`--check` fails (exit 1) when a case costs more than TOLERANCE_PERCENT above its committed
figure, and says so when one costs that much less (refresh the figure with `--write`). Figures
are kept per interpreter build (`sys.version`) and per record scan (compiled or not): either
counts differently.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import importlib.metadata
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._engine_calls import DEFAULT_POLICIES, make_engine, produce_frame
from kvproxy.protocol.budget import Allowance, MemoryBudget
from kvproxy.protocol.framing import size_prefix
from kvproxy.protocol.messages import (
    PRODUCE,
    decode_request,
    encode_response,
    make_response,
)
from kvproxy.protocol.produce import partition_answer, produce_answer, produce_response_types
from kvproxy.protocol.records import build_batch, skim
from kvproxy.protocol.request_view import RequestView
from kvproxy.proxy.produce.decider import INLINE_DECODE_BYTES
from kvproxy.proxy.produce.engine import ProduceEngine
from kvproxy.proxy.produce.exchange import ProduceExchange
from kvproxy.proxy.produce.many_partitions import read_unless_many

ROOT = Path(__file__).resolve().parents[1]

FIGURES = ROOT / "bench" / "instructions.json"
TOLERANCE_PERCENT = 3.0
"""How much a case may grow before `--check` fails. Repeated runs agree to the instruction, so
the margin is for changes that move a count without touching the hot path (what else is imported
or allocated changes dict sizes and the allocator's state); a real slowdown of the hot path (an
extra pass over the records, a copy of the batch, a per-record call) costs more than 3%."""
TOGGLE = "functools_reduce"
"""The C function callgrind collects in: the measured loops are its only calls."""
NOW_MS = 1_767_225_600_000
"""2026-01-01T00:00:00Z: every record's timestamp and the clock `decide` judges them by."""
VGDB_PREFIX = "KVPROXY_VGDB_PREFIX"
"""Where the measured process finds valgrind's FIFOs (in the run's own temporary directory)."""
TOPIC = "bench-instructions"
RECORD_BYTES = 1024
KEY_BYTES = 10
LARGE_RECORDS = 1024
"""1024 records of 1 KiB: one batch of about 1 MiB."""
WORDS = ("click", "view", "order", "cart", "pay", "refund", "login", "search", "share", "like")
JSON_POLICIES: tuple[str, ...] = (*DEFAULT_POLICIES, "json")


# ---- inputs --------------------------------------------------------------------------------


def json_value(rng: random.Random, index: int) -> bytes:
    """A JSON object of exactly RECORD_BYTES - KEY_BYTES bytes."""
    document = {
        "id": index,
        "event": rng.choice(WORDS),
        "user": f"user-{rng.randrange(100_000):05d}",
        "amount": rng.randrange(1_000_000) / 100,
        "tags": [rng.choice(WORDS) for _ in range(8)],
        "note": "",
    }
    size = RECORD_BYTES - KEY_BYTES
    bare = json.dumps(document, separators=(",", ":"))
    document["note"] = " ".join(rng.choice(WORDS) for _ in range(size // 4))[: size - len(bare)]
    value = json.dumps(document, separators=(",", ":")).encode()
    assert len(value) == size, len(value)
    return value


def make_batch(count: int, seed: int = 30) -> bytes:
    """One uncompressed magic-2 batch of `count` keyed 1 KiB records stamped NOW_MS."""
    rng = random.Random(seed)
    records = [(b"key-%06d" % i, json_value(rng, i), None, NOW_MS) for i in range(count)]
    return build_batch(records)


def produce_request(partitions: Sequence[bytes]) -> bytes:
    """A Produce v9 request (acks=all) with partition i of TOPIC carrying `partitions[i]`."""
    return produce_frame(
        *partitions, topic=TOPIC, correlation_id=7, client_id="kvproxy-instructions"
    )


def broker_answer(partitions: Sequence[int]) -> bytes:
    """The broker's Produce v9 answer, no error, for the given partitions of TOPIC."""
    types = produce_response_types(9)
    body = produce_answer(types, [(TOPIC, [partition_answer(types, i, 0) for i in partitions])])
    return encode_response(PRODUCE, 9, make_response(PRODUCE, 9, 7, body))


# ---- the measured work ---------------------------------------------------------------------


def produce_step(engine: ProduceEngine, frame: bytes, upstream: bytes) -> Callable[[], bytes]:
    """One Produce request as the proxy handles it on the event loop (`ProduceExchange.start`):
    read, decided with an inline allowance, and its broker answer passed through
    `ProduceExchange.merged`."""
    budget = MemoryBudget(64 * 1024 * 1024)
    bound = engine.settings.inline_max_partitions

    def step() -> bytes:
        request = read_unless_many(RequestView(frame), bound)
        assert request is not None  # one partition: read on the loop
        allowance = Allowance(INLINE_DECODE_BYTES, budget, inline=True)
        try:
            decision = engine.decide(frame, request, now_ms=NOW_MS, allowance=allowance)
        finally:
            allowance.release()
        exchange = ProduceExchange(engine)
        exchange.decision = decision
        return exchange.merged(upstream)

    answer = step()
    if answer is not upstream:  # every partition accepted: forwarded and answered as they are
        raise AssertionError("the case's request was not accepted whole")
    return step


def merge_step() -> Callable[[], bytes]:
    """The answer to a request of two one-record partitions, the second refused (bad CRC): the
    broker's answer for the first merged with the proxy's error for the second."""
    good = make_batch(1)
    bad = bytearray(make_batch(1, seed=31))
    bad[-1] ^= 0xFF  # the last value byte: the CRC no longer matches
    frame = produce_request([good, bytes(bad)])
    engine = make_engine(DEFAULT_POLICIES)
    decision = engine.decide(frame, decode_request(frame), now_ms=NOW_MS)
    if [o.index for o in decision.rejected] != [1] or decision.forward is None:
        raise AssertionError(f"the merge case was not decided as one refusal: {decision}")
    exchange = ProduceExchange(engine)
    exchange.decision = decision
    upstream = broker_answer([0])

    def step() -> bytes:
        return exchange.merged(upstream)

    if step() is upstream:
        raise AssertionError("the merge case's answer was not merged")
    return step


def accept_step() -> Callable[[], object]:
    """The compiled fast accept of a one-record request (`ProduceEngine.accept_compiled`), its
    topic's form looked up as on the event loop."""
    engine = make_engine(DEFAULT_POLICIES)
    frame = produce_request([make_batch(1)])

    def step() -> object:
        return engine.accept_compiled(frame, now_ms=NOW_MS)

    if step() is None:
        raise AssertionError("the compiled fast accept did not accept the case's request")
    return step


def relay_step(*, compiled: bool) -> Callable[[], Callable[[], object]]:
    """A one-record Produce request and its broker answer through a client connection and its
    upstream side on in-memory transports (tests/harness/connection_pair.py): every Python call
    the relay makes for it, the compiled fast accept's path or (`compiled` False) the Python
    path's."""

    def build() -> Callable[[], object]:
        from tests.harness import connection_pair  # noqa: PLC0415

        pair = _KEPT.enter_context(connection_pair.connection_pair())
        if not compiled:  # this engine's fast accept is never sure (one small call more)
            engine = pair.server.connection_state.decisions.engine
            engine.accept_compiled = lambda _frame, now_ms=None: None  # type: ignore[method-assign]
        payload = connection_pair.produce_request(9, 5)
        answered = connection_pair.produce_answer_ok(9, 5)
        request, answer = size_prefix(payload) + payload, size_prefix(answered) + answered
        client, upstream = pair.client, pair.upstream

        def feed(side: Any, data: bytes) -> None:
            buffer = side.get_buffer(len(data))
            buffer[: len(data)] = data
            side.buffer_updated(len(data))

        def step() -> object:
            feed(client, request)
            feed(upstream, answer)
            written = bytes(pair.to_client.written)
            pair.to_client.written.clear()
            pair.to_broker.written.clear()
            return written

        if step() != answer:
            raise AssertionError("the relay case's answer is not the broker's")
        return step

    return build


_KEPT = contextlib.ExitStack()
"""The relay cases' proxies, kept open while the cases run."""


@dataclass(frozen=True)
class Case:
    description: str
    iterations: int
    """Loop length under callgrind: the count is per iteration, enough to dwarf the loop."""
    build: Callable[[], Callable[[], object]]


def _request_case(records: int, policies: Sequence[str]) -> Callable[[], Callable[[], object]]:
    def build() -> Callable[[], object]:
        frame = produce_request([make_batch(records)])
        return produce_step(make_engine(policies), frame, broker_answer([0]))

    return build


CASES: dict[str, Case] = {
    "produce_1mib_default": Case(
        "Produce v9, one partition, one uncompressed v2 batch of 1024 records of 1 KiB (about "
        "1 MiB), default checks (batch_integrity, crc, timestamps, compacted_key; topic not "
        "compacted): read_unless_many, decide, merged",
        4,
        _request_case(LARGE_RECORDS, DEFAULT_POLICIES),
    ),
    "produce_1mib_json": Case(
        "the same request with the default checks and json (every value parsed)",
        4,
        _request_case(LARGE_RECORDS, JSON_POLICIES),
    ),
    "produce_small": Case(
        "Produce v9, one partition, one batch of one 1 KiB record, default checks: "
        "read_unless_many, decide, merged",
        200,
        _request_case(1, DEFAULT_POLICIES),
    ),
    "accept_small": Case(
        "ProduceEngine.accept_compiled (the compiled fast accept) of the produce_small request",
        400,
        accept_step,
    ),
    "relay_small": Case(
        "a Produce v9 request of one 100-byte record and its broker answer through a client "
        "connection and its upstream side (in-memory transports), accepted by the compiled "
        "fast accept",
        200,
        relay_step(compiled=True),
    ),
    "relay_small_python": Case(
        "the same through the Python path (the fast accept's twin: never sure)",
        200,
        relay_step(compiled=False),
    ),
    "merge_small": Case(
        "ProduceExchange.merged for a request of two one-record partitions, the second refused "
        "(bad CRC): the broker's answer for the first merged with the refusal",
        200,
        merge_step,
    ),
}
WARM_UP = 20
"""Runs of each case before counting: CPython 3.11 specialises a function's bytecode after a few
calls, and the first calls fill caches (routing, chains)."""


# ---- inside valgrind -----------------------------------------------------------------------


def instrumentation_on() -> None:
    """Ask valgrind's gdbserver, through vgdb, to instrument from now on. The interpreter keeps
    running meanwhile (valgrind polls for vgdb's command while code runs, not in a syscall)."""
    prefix = os.environ[VGDB_PREFIX]
    vgdb = subprocess.Popen(
        ["vgdb", f"--vgdb-prefix={prefix}", f"--pid={os.getpid()}", "instrumentation", "on"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while vgdb.poll() is None and time.monotonic() < deadline:
        pass
    if vgdb.poll() != 0:
        vgdb.kill()
        output = vgdb.communicate()[0].decode(errors="replace")
        raise SystemExit(f"vgdb could not switch instrumentation on: {output}")


def run_measured(names: Sequence[str]) -> None:
    """Build and warm up every case, then run each one's loop inside one `functools.reduce`."""
    steps = {name: CASES[name].build() for name in names}
    for step in steps.values():
        for _ in range(WARM_UP):
            step()
    instrumentation_on()
    for name in names:
        step = steps[name]
        gc.collect()
        gc.disable()
        try:
            counted_loop(step, CASES[name].iterations)
        finally:
            gc.enable()


def counted_loop(step: Callable[[], object], iterations: int) -> None:
    """`step` run `iterations` times inside one call of the C function callgrind counts in."""
    functools.reduce(lambda _acc, _i: step(), range(iterations), None)


# ---- outside: valgrind runs and figures ----------------------------------------------------


def measure(names: Sequence[str]) -> dict[str, int]:
    """One valgrind run of the named cases: instructions per iteration of each."""
    if shutil.which("valgrind") is None or shutil.which("vgdb") is None:
        raise SystemExit("valgrind is missing: apt-get install valgrind (make test installs it)")
    with tempfile.TemporaryDirectory(prefix="kvproxy-callgrind-") as tmp:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--collect-atstart=no",
            f"--toggle-collect={TOGGLE}",
            f"--dump-after={TOGGLE}",
            f"--callgrind-out-file={tmp}/callgrind.out",
            f"--vgdb-prefix={tmp}/vgdb",
            sys.executable,
            "-m",
            "bench.instructions",
            "--inside",
            ",".join(names),
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0", VGDB_PREFIX: f"{tmp}/vgdb"}
        result = subprocess.run(
            command, env=env, cwd=ROOT, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise SystemExit(f"the measured run failed:\n{result.stdout}{result.stderr}")
        dumps = sorted(Path(tmp).glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        totals = [_total(dump) for dump in dumps]
    if len(totals) != len(names):
        raise SystemExit(
            f"{len(totals)} profiles for {len(names)} cases: something else called {TOGGLE}"
        )
    return {
        name: round(total / CASES[name].iterations)
        for name, total in zip(names, totals, strict=True)
    }


def _total(dump: Path) -> int:
    match = re.search(r"^totals: (\d+)", dump.read_text(), re.MULTILINE)
    if match is None or int(match[1]) == 0:
        raise SystemExit(f"{dump.name} counted nothing: was instrumentation switched on?")
    return int(match[1])


def interpreter() -> str:
    """The key of the figures: the interpreter's build and whether the record scan is compiled
    (`kvproxy.protocol.records.skim.COMPILED`); either changes the counts by far more than the
    tolerance."""
    scan = "compiled" if skim.COMPILED else "pure Python"
    return f"{platform.python_implementation()} {sys.version} {platform.machine()}, {scan} scan"


@dataclass(frozen=True)
class Change:
    case: str
    committed: int
    now: int

    @property
    def percent(self) -> float:
        return (self.now - self.committed) / self.committed * 100

    def describe(self) -> str:
        return (
            f"{self.case}: committed {self.committed:,} Ir per iteration, now {self.now:,} "
            f"({self.percent:+.2f}%)"
        )


@dataclass(frozen=True)
class Comparison:
    grew: tuple[Change, ...]
    """Cases above the committed figure by more than the tolerance: the check fails."""
    fell: tuple[Change, ...]
    """Cases below it by more than the tolerance: the figure should be refreshed."""
    within: tuple[Change, ...]
    missing: tuple[str, ...]
    """Measured cases with no committed figure."""


def compare(
    committed: Mapping[str, int], now: Mapping[str, int], tolerance_percent: float
) -> Comparison:
    changes = [
        Change(case, committed[case], count) for case, count in now.items() if case in committed
    ]
    return Comparison(
        grew=tuple(c for c in changes if c.percent > tolerance_percent),
        fell=tuple(c for c in changes if c.percent < -tolerance_percent),
        within=tuple(c for c in changes if abs(c.percent) <= tolerance_percent),
        missing=tuple(case for case in now if case not in committed),
    )


def check_report(comparison: Comparison, tolerance_percent: float) -> tuple[int, list[str]]:
    """The exit status of `--check` and what it prints."""
    lines = [f"within {tolerance_percent}%: {c.describe()}" for c in comparison.within]
    lines += [
        f"FELL by more than {tolerance_percent}%: {c.describe()}; refresh the committed figure "
        "with `python -m bench.instructions --write`"
        for c in comparison.fell
    ]
    lines += [
        f"GREW by more than {tolerance_percent}%: {c.describe()}; the hot path got slower (or, "
        "for a deliberate change, refresh with `python -m bench.instructions --write`)"
        for c in comparison.grew
    ]
    lines += [
        f"NO FIGURE: {case} has no committed figure for this build; "
        "`python -m bench.instructions --write` adds it"
        for case in comparison.missing
    ]
    return (1 if comparison.grew or comparison.missing else 0), lines


def load_figures(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def write_figures(path: Path, counts: Mapping[str, int]) -> None:
    """Add or replace this interpreter's figures for the measured cases."""
    figures = load_figures(path)
    figures["what"] = (
        "Instructions (callgrind Ir) per iteration of each case of bench/instructions.py, per "
        "interpreter build; refreshed with `python -m bench.instructions --write`"
    )
    figures["tolerance_percent"] = TOLERANCE_PERCENT
    figures["cases"] = {name: case.description for name, case in CASES.items()}
    builds = figures.setdefault("interpreters", {})
    entry = builds.setdefault(interpreter(), {})
    entry["python"] = platform.python_version()
    entry["libraries"] = {
        name: importlib.metadata.version(name) for name in ("kio", "aiokafka", "crc32c", "orjson")
    }
    entry["commit"] = _commit()
    entry["written"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%MZ")
    entry.setdefault("ir_per_iteration", {}).update(counts)
    entry["iterations"] = {name: CASES[name].iterations for name in entry["ir_per_iteration"]}
    path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")


def _commit() -> str:
    result = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="compare with the committed figure")
    action.add_argument("--write", action="store_true", help="refresh the committed figure")
    action.add_argument("--inside", help=argparse.SUPPRESS)  # the process valgrind runs
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--repeat", type=int, default=1, help="whole runs (shows the spread)")
    parser.add_argument("--figures", type=Path, default=FIGURES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        run_measured(args.inside.split(","))
        return 0
    names = args.cases.split(",")
    unknown = [name for name in names if name not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    started = time.monotonic()
    runs = [measure(names) for _ in range(args.repeat)]
    counts = {name: round(statistics.median(run[name] for run in runs)) for name in names}
    for name in names:
        seen = [run[name] for run in runs]
        spread = (max(seen) - min(seen)) / min(seen) * 100
        detail = f"  runs {', '.join(f'{s:,}' for s in seen)}, spread {spread:.3f}%"
        print(f"{name}: {counts[name]:,} Ir per iteration" + (detail if len(runs) > 1 else ""))
    print(f"({time.monotonic() - started:.0f} s, {interpreter()})")
    if args.write:
        write_figures(args.figures, counts)
        print(f"written to {args.figures}")
        return 0
    if not args.check:
        return 0
    build = load_figures(args.figures).get("interpreters", {}).get(interpreter(), {})
    status, lines = check_report(
        compare(build.get("ir_per_iteration", {}), counts, TOLERANCE_PERCENT), TOLERANCE_PERCENT
    )
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
