"""Lookup slots shared fairly between the connections that need them.

Every registry lookup holds one of `total` slots while it runs. A connection (an `owner`) holds
at most `per_owner` of them, and a freed slot goes to the owners waiting in turn (round-robin),
not to whoever asked first: one client sending ids the registry is slow to answer fills its own
share, and another client's lookup still finds a slot.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Hashable

__all__ = ["LookupSlots"]

_NOBODY = object()
"""No waiting owner may take a slot now (None is an owner: a caller with no share)."""


class LookupSlots:
    """`total` slots, at most `per_owner` per owner; waiting owners served in turn. Used on the
    event loop only."""

    def __init__(self, total: int, per_owner: int) -> None:
        if total < 1 or per_owner < 1:
            raise ValueError("lookup slots: total and per_owner must be positive")
        self.total = total
        self.per_owner = per_owner
        self.free = total
        self._held: dict[Hashable, int] = {}
        self._waiting: OrderedDict[Hashable, deque[asyncio.Future[None]]] = OrderedDict()
        """Owners with lookups waiting for a slot, in the order they are served next."""

    def held_by(self, owner: Hashable) -> int:
        return self._held.get(owner, 0)

    async def acquire(self, owner: Hashable | None) -> None:
        """Wait for a slot for `owner` (None: a caller with no share to keep, the audit's
        driver: bound by `total` only). A caller cancelled while waiting holds nothing."""
        if not self._waiting and self.free > 0 and self._may_hold(owner):
            self._take(owner)
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(owner, deque()).append(granted)
        self._grant()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(owner)  # granted as it was cancelled: give it back
            else:
                self._forget(owner, granted)
            raise

    def release(self, owner: Hashable | None) -> None:
        held = self._held.get(owner, 0) - 1
        if held > 0:
            self._held[owner] = held
        else:
            self._held.pop(owner, None)
        self.free += 1
        self._grant()

    def _may_hold(self, owner: Hashable | None) -> bool:
        return owner is None or self._held.get(owner, 0) < self.per_owner

    def _take(self, owner: Hashable | None) -> None:
        self.free -= 1
        self._held[owner] = self._held.get(owner, 0) + 1

    def _grant(self) -> None:
        """Hand free slots to waiting owners in turn; an owner at its share is passed over
        (it keeps its place) until one of its lookups ends."""
        while self.free > 0 and self._waiting:
            served: Hashable | None = _NOBODY
            for owner in self._waiting:
                if self._may_hold(owner):
                    served = owner
                    break
            if served is _NOBODY:
                return
            queue = self._waiting.pop(served)
            granted = queue.popleft()
            if queue:
                self._waiting[served] = queue  # to the back of the turn
            if granted.done():
                # cancelled while waiting, its handler not run yet (it then finds nothing to
                # forget): the slot goes to the next waiter
                continue
            self._take(served)
            granted.set_result(None)

    def _forget(self, owner: Hashable | None, granted: asyncio.Future[None]) -> None:
        queue = self._waiting.get(owner)
        if queue is None:
            return
        try:
            queue.remove(granted)
        except ValueError:
            return
        if not queue:
            del self._waiting[owner]
