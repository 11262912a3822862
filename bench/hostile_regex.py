"""Regular expressions from outside: how long a pattern from a registry or the config holds the
proxy, and what a rule set blown up by YAML aliases costs.

The proxy scenarios run a fresh Tansu broker and `kvproxy serve` from this file's checkout, with
the other client of `bench/hostile.py` (one small Produce at a time on its own connection, its
docstring says how): its longest wait while the hostile requests are answered is how long the
event loop was held.

    topic-rule    a rule `/.*-.*-events/`; the hostile client sends 3 Produce requests, one at a
                  time, to a topic named by 16,000 characters ("-" * 16,000)
    registry      a registered JSON Schema {"type": "string", "pattern": "^(a+)+$"} and a
                  `schema` rule that checks payloads; the hostile client sends one record whose
                  value is "a" * N + "!" (N = --letters, 24 by default: each one more doubles a
                  backtracking engine's time)
    rules         in this process, no proxy: a 760 KB file whose aliases make 190,002 topic
                  rules is loaded (`load_config_and_rules`), then one of 10,000 rules (the
                  limit), and 2,000 new topic names are routed with each set that loaded

    .venv/bin/python -m bench.hostile_regex [--scenarios topic-rule,registry,rules]
        [--letters 24] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import hostile
from bench._brokers import create_topic, tansu
from bench._hostile_inputs import OTHER_TOPIC, framed, produce_request
from bench._hostile_watch import OtherClient
from bench._load import percentile
from bench._relays import start_proxy
from bench._results import ROOT
from kvproxy.protocol.records import build_batch
from kvproxy.proxy.config.proxy_config import load_config_and_rules
from kvproxy.settings.loading import ConfigError
from tests.harness.schema_registry import TestRegistry
from tests.harness.socket_frames import read_frame

LONG_TOPIC = "-" * 16_000
EVENTS_RULE = 'topics:\n  - match: "/.*-.*-events/"\n    mode: warn\n'
REGISTRY_TOPIC = "registry-checked"
PATTERN_SCHEMA = {"title": "Code", "type": "string", "pattern": "^(a+)+$"}
REQUEST_TIMEOUT = 600.0


def _send_and_wait(port: int, frames: list[bytes]) -> list[float]:
    """Each frame sent alone on one connection; seconds until its answer."""
    seconds: list[float] = []
    with socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT) as sock:
        for frame in frames:
            began = time.perf_counter()
            sock.sendall(frame)
            read_frame(sock)
            seconds.append(time.perf_counter() - began)
    return seconds


def _with_other_client(
    port: int, send: Callable[[], list[float]]
) -> tuple[list[float], dict[str, float]]:
    """`send()`'s figures, and the other client's waits while it ran."""
    other = OtherClient(port, REQUEST_TIMEOUT)
    other.start()
    time.sleep(1.0)  # its first answers
    began = time.perf_counter()
    seconds = send()
    ended = time.perf_counter()
    during = sorted(other.latencies(began, ended))
    other.stop()
    return seconds, {
        "other_requests": len(during),
        "other_p99_ms": percentile(during, 0.99) * 1e3,
        "other_max_ms": (during[-1] if during else float("nan")) * 1e3,
    }


def scenario_topic_rule(args: argparse.Namespace) -> dict[str, Any]:
    batch = build_batch([(b"k", b"v" * 100, None, None)])
    frames = [framed(produce_request(LONG_TOPIC, [batch]), n) for n in range(1, 4)]
    with tansu() as server, start_proxy(server.broker.bootstrap, rules=EVENTS_RULE) as proxy:
        create_topic(server.broker.bootstrap, OTHER_TOPIC, 1)
        seconds, other = _with_other_client(proxy.port, lambda: _send_and_wait(proxy.port, frames))
    return {"seconds_per_request": seconds, **other}


def scenario_registry(args: argparse.Namespace) -> dict[str, Any]:
    with TestRegistry() as registry:
        schema_id = registry.register(f"{REGISTRY_TOPIC}-value", json.dumps(PATTERN_SCHEMA), "JSON")
        value = (
            b"\x00" + struct.pack(">I", schema_id) + json.dumps("a" * args.letters + "!").encode()
        )
        batch = build_batch([(b"k", value, None, None)])
        frames = [framed(produce_request(REGISTRY_TOPIC, [batch]), 1)]
        rules = (
            f'topics:\n  - match: "{REGISTRY_TOPIC}"\n    default_policies: drop\n'
            "    policies: [crc, {schema: "
            "{value: required, validate_payload: true}}]\n"
        )
        extra = f"schema_registry: {{url: '{registry.url}', timeout_ms: 5000}}\n"
        with (
            tansu() as server,
            start_proxy(server.broker.bootstrap, rules=rules, extra_yaml=extra) as proxy,
        ):
            create_topic(server.broker.bootstrap, OTHER_TOPIC, 1)
            create_topic(server.broker.bootstrap, REGISTRY_TOPIC, 1)
            # the id is fetched (and the schema compiled) by a first, valid record
            valid = b"\x00" + struct.pack(">I", schema_id) + b'"aaa"'
            _send_and_wait(
                proxy.port,
                [
                    framed(
                        produce_request(REGISTRY_TOPIC, [build_batch([(b"k", valid, None, None)])]),
                        9,
                    )
                ],
            )
            seconds, other = _with_other_client(
                proxy.port, lambda: _send_and_wait(proxy.port, frames)
            )
    return {"value_bytes": len(value) - 5, "seconds_per_request": seconds, **other}


def _rules_file(directory: Path, rules: str) -> Path:
    path = directory / "kvproxy.yaml"
    path.write_text("upstream: {bootstrap_servers: ['127.0.0.1:9092']}\n" + rules)
    return path


def _route_new_names(routing: Any, count: int) -> float:
    began = time.perf_counter()
    for n in range(count):
        routing.rule_for(f"bench-{n}-new-topic")
    return (time.perf_counter() - began) / count


def scenario_rules(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kvbench-rules-") as tmp:
        aliases = ", ".join(["*r"] * 190_001)
        bomb = _rules_file(
            Path(tmp), f"topics: [&r {{match: 'orders-*', mode: warn}}, {aliases}]\n"
        )
        out["alias_file_bytes"] = bomb.stat().st_size
        began = time.perf_counter()
        try:
            _, routing = load_config_and_rules(bomb)
            out["alias_file_load_seconds"] = time.perf_counter() - began
            out["alias_file"] = f"accepted: {len(routing.rules):,} rules"
            out["alias_file_seconds_per_new_name"] = _route_new_names(routing, 200)
        except ConfigError as exc:
            out["alias_file_load_seconds"] = time.perf_counter() - began
            out["alias_file"] = "refused: " + str(exc).splitlines()[-1].strip()[:160]
        limit = "\n".join(f"  - {{match: '/t{n}-.*-events/', mode: warn}}" for n in range(10_000))
        path = _rules_file(Path(tmp), "topics:\n" + limit + "\n")
        began = time.perf_counter()
        _, routing = load_config_and_rules(path)
        out["rules_10000_load_seconds"] = time.perf_counter() - began
        out["rules_10000_seconds_per_new_name"] = _route_new_names(routing, 2_000)
    return out


SCENARIOS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "topic-rule": scenario_topic_rule,
    "registry": scenario_registry,
    "rules": scenario_rules,
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--letters", type=int, default=24)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"code": hostile.code_location(), "root": str(ROOT)}
    for name in args.scenarios.split(","):
        print(f"== {name}", flush=True)
        results[name] = SCENARIOS[name](args)
        print(json.dumps(results[name], indent=2), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
