"""How long the event loop is held: how late a timer due every `LAG_TICK_S` runs, into the
metrics (`kvproxy_event_loop_lag_seconds`, and the longest of the last `LAG_WINDOW_S`)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from kvproxy.proxy.ops.metrics import ProxyMetrics

__all__ = ["LAG_TICK_S", "LAG_WINDOW_S", "watch_loop_lag"]

LAG_TICK_S = 0.1
LAG_WINDOW_S = 60.0


async def watch_loop_lag(metrics: ProxyMetrics, stopping: Callable[[], bool]) -> None:
    """How late a timer due every `LAG_TICK_S` runs: the longest the loop was held (until
    `stopping()` says so)."""
    loop = asyncio.get_running_loop()
    recent: collections.deque[tuple[float, float]] = collections.deque()
    while not stopping():
        due = loop.time() + LAG_TICK_S
        await asyncio.sleep(LAG_TICK_S)
        now = loop.time()
        lag = max(0.0, now - due)
        metrics.loop_lag.observe(lag)
        while recent and recent[0][0] < now - LAG_WINDOW_S:  # out of the window
            recent.popleft()
        while recent and recent[-1][1] <= lag:  # no longer the longest of anything
            recent.pop()
        recent.append((now, lag))  # decreasing lags: the first is the window's longest
        metrics.loop_lag_max.set(recent[0][1])
