"""How often the proxy asks the cluster about names clients choose.

Every Produce to a name the proxy has not described yet costs a request to the cluster; a client
inventing names would otherwise turn each of its requests into one of the proxy's own. Two
bounds: each connection may have new names described at `per_second` (a token bucket holding
`burst`: a client's first request may name that many new topics), and the proxy's own requests
go at most `per_second` a second (`RequestPacer`: names asked meanwhile wait and go together in
the next request).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable


class ClientLookupBudget:
    """New names each connection may have described: `burst` at once, refilled `per_second`."""

    def __init__(
        self, per_second: int, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_second = per_second
        self.burst = burst
        self._clock = clock
        self._buckets: weakref.WeakKeyDictionary[object, tuple[float, float]] = (
            weakref.WeakKeyDictionary()
        )
        """client -> (names left, when counted): dropped with the connection."""

    def grant(self, client: object, wanted: int) -> int:
        """How many of `wanted` new names `client` may have described now (taken)."""
        now = self._clock()
        left, then = self._buckets.get(client, (float(self.burst), now))
        left = min(float(self.burst), left + (now - then) * self.per_second)
        granted = min(wanted, int(left))
        self._buckets[client] = (left - granted, now)
        return granted


class RequestPacer:
    """At most `per_second` requests a second: `wait` returns when the next may go."""

    def __init__(self, per_second: int) -> None:
        self.per_second = per_second
        self._next = float("-inf")

    async def wait(self) -> None:
        loop = asyncio.get_running_loop()
        delay = self._next - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        self._next = loop.time() + 1 / self.per_second
