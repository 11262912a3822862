"""Fresh schema ids behind a registry that takes connections and never answers (a tarpit): how
long each lookup waits, with the proxy's registry settings (`timeout_ms` 2000,
`negative_cache_ttl_ms` 5000 unless given).

The test registry (`tests/harness/schema_registry.TestRegistry`, failure mode "slow" for
longer than the run) and one `RegistryCatalog`. One request at a time looks up one id the
catalog has not seen, `--pause` seconds apart (a producer's retry backoff), `--requests` of
them; the figures are each wait's p50 / p99 / max and how many asked the registry.

    .venv/bin/python -m bench.registry_tarpit [--requests 40] [--pause 0.1] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from kvproxy.registry.catalog import RegistryCatalog
from kvproxy.settings.schema_registry import SchemaRegistryConfig
from tests.harness.schema_registry import TestRegistry


async def _run(requests: int, pause: float, timeout_ms: int, negative_ms: int) -> dict[str, Any]:
    with TestRegistry(slow_s=3_600.0) as tarpit:
        tarpit.fail = "slow"
        config = SchemaRegistryConfig(
            url=[tarpit.url], timeout_ms=timeout_ms, negative_cache_ttl_ms=negative_ms
        )
        catalog = RegistryCatalog(config)
        waits = []
        try:
            for schema_id in range(1, requests + 1):
                began = time.perf_counter()
                await catalog.fetch({schema_id}, owner="innocent", wait_s=10.0)
                waits.append(time.perf_counter() - began)
                await asyncio.sleep(pause)
        finally:
            await catalog.aclose()
        asked = sum(tarpit.count(f"/schemas/ids/{n}") > 0 for n in range(1, requests + 1))
    waits.sort()
    return {
        "requests": requests,
        "timeout_ms": timeout_ms,
        "negative_cache_ttl_ms": negative_ms,
        "p50_ms": round(statistics.median(waits) * 1000, 1),
        "p99_ms": round(waits[min(len(waits) - 1, int(len(waits) * 0.99))] * 1000, 1),
        "max_ms": round(waits[-1] * 1000, 1),
        "lookups_that_asked_the_registry": asked,
        "lookups_waiting_over_1s": sum(w > 1.0 for w in waits),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--pause", type=float, default=0.1)
    parser.add_argument("--timeout-ms", type=int, default=2_000)
    parser.add_argument("--negative-cache-ttl-ms", type=int, default=5_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = asyncio.run(
        _run(args.requests, args.pause, args.timeout_ms, args.negative_cache_ttl_ms)
    )
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
