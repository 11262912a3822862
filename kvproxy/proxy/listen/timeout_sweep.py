"""Closing idle and stalled client connections: one task for the whole proxy.

One pass over the open connections every tick instead of a timer per connection, so neither a
read nor a request ever touches a timer. A tenth of the shorter timeout (between 10 ms and 5 s)
per tick: a connection is closed at most that much later than its timeout.
"""

from __future__ import annotations

import asyncio

from kvproxy.proxy.config.proxy_config import LimitsConfig
from kvproxy.proxy.listen.client_connections import ClientConnections
from kvproxy.proxy.ops.log_limits import flush_ended

_SWEEP_MIN_S = 0.01
_SWEEP_MAX_S = 5.0


async def sweep_timeouts(limits: LimitsConfig, connections: ClientConnections) -> None:
    """Every tick, let each connection close itself if its time is up, and log the connections
    refused and the lines not written since the last line about them. Runs until cancelled."""
    idle_after = limits.idle_timeout_ms / 1000
    stall_after = limits.request_timeout_ms / 1000
    frame_after = limits.frame_receive_timeout_ms / 1000
    tick = min(max(min(idle_after, stall_after, frame_after) / 10, _SWEEP_MIN_S), _SWEEP_MAX_S)
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(tick)
        now = loop.time()
        for client in connections.open_now():
            client.check_timeouts(now, idle_after, stall_after)
        connections.log_refusals(now)
        flush_ended()
