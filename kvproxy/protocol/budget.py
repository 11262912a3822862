"""Memory budgets: how many bytes decoding may hold, per request and per process.

A few KiB of zstd can claim gigabytes, and decoded records cost far more than their bytes, so
what a request may make the proxy hold is counted before it is allocated. A `MemoryBudget` is a
process-wide pool (thread-safe: decoding may run off the event loop); an `Allowance` is one
request's share of it, with its own limit. Whatever an allowance took goes back with `release()`.

`take` either succeeds or raises `BudgetExhausted` (its message names the limit that stopped it);
nothing here waits.
"""

from __future__ import annotations

import threading
from typing import ClassVar

from kvproxy.protocol import error_codes
from kvproxy.protocol.errors import ProtocolError

__all__ = [
    "Allowance",
    "BudgetExhausted",
    "InlineLimitReached",
    "MemoryBudget",
    "OutOfMemory",
    "ProcessBudgetFull",
    "ResourceLimit",
    "RetryLater",
]


class ResourceLimit(ProtocolError):
    """Input that is well formed but would cost more than the proxy allows: answered, never a
    reason to close the connection."""

    error_code: ClassVar[int] = error_codes.MESSAGE_TOO_LARGE


class BudgetExhausted(ResourceLimit):
    """Decoding a partition would hold more memory than a budget allows."""


class RetryLater(BudgetExhausted):
    """A refusal whose cause passes (memory the proxy lacks now, not what the request asks):
    answered NOT_ENOUGH_REPLICAS, which librdkafka, the Java client and kafka-python all retry
    without a metadata refresh, and which says nothing was written (Kafka has no "busy" code).
    The client sends the same batch again, so nothing of it is kept."""

    error_code: ClassVar[int] = error_codes.NOT_ENOUGH_REPLICAS


class OutOfMemory(RetryLater):
    """A decompressor could not allocate the memory it needed: the proxy's own failure, not the
    data's, so never answered as corrupt."""


class ProcessBudgetFull(RetryLater):
    """What a partition needs fits its request's allowance, but the process budget is in use by
    other requests: it would fit once they are done."""


class InlineLimitReached(ResourceLimit):
    """Decoding needs more than may be done on the event loop: the caller redoes it elsewhere.

    Never answered to a client; raised only by an allowance built with `inline=True`."""


class MemoryBudget:
    """Bytes that may be held at once by every request of this process together."""

    __slots__ = ("_lock", "in_use", "limit", "name", "peak")

    def __init__(self, limit: int, name: str = "limits.decode_memory_bytes") -> None:
        if limit <= 0:
            raise ValueError("a memory budget must be positive")
        self.limit = limit
        self.name = name
        """The setting that sets `limit`, named in the error when it is reached."""
        self.in_use = 0
        self.peak = 0
        self._lock = threading.Lock()

    def try_take(self, nbytes: int) -> bool:
        with self._lock:
            if self.in_use + nbytes > self.limit:
                return False
            self.in_use += nbytes
            self.peak = max(self.peak, self.in_use)
            return True

    def give_back(self, nbytes: int) -> None:
        with self._lock:
            self.in_use = max(0, self.in_use - nbytes)


class Allowance:
    """What one request may hold while it is decoded: at most `limit` bytes, taken from `budget`.

    `inline=True` marks an allowance for decoding on the event loop: past its limit it raises
    `InlineLimitReached` (the caller moves the work off the loop) instead of `BudgetExhausted`.
    """

    __slots__ = ("budget", "held", "inline", "limit", "name", "peak")

    def __init__(
        self,
        limit: int,
        budget: MemoryBudget | None = None,
        *,
        name: str = "limits.decode_bytes_per_request",
        inline: bool = False,
    ) -> None:
        self.limit = limit
        self.budget = budget
        self.name = name
        self.inline = inline
        self.held = 0
        self.peak = 0

    def available(self) -> int:
        """Bytes this allowance could still take (the process budget may still refuse)."""
        room = self.limit - self.held
        if self.budget is not None:
            room = min(room, self.budget.limit - self.budget.in_use)
        return max(0, room)

    def take(self, nbytes: int, what: str) -> None:
        """Count `nbytes` about to be allocated for `what`, or raise without counting."""
        if nbytes <= 0:
            return
        if self.held + nbytes > self.limit:
            raise self.refusal(nbytes, what)
        if self.budget is not None and not self.budget.try_take(nbytes):
            raise self._process_refusal(nbytes, what)
        self.held += nbytes
        self.peak = max(self.peak, self.held)

    def refusal(self, nbytes: int, what: str) -> ResourceLimit:
        """The error `take(nbytes, what)` raises when `nbytes` do not fit (which limit: this
        allowance's, else the process budget's)."""
        if self.held + nbytes <= self.limit and self.budget is not None:
            return self._process_refusal(nbytes, what)
        if self.inline:
            return InlineLimitReached(f"{what} needs more than the event loop may decode")
        return BudgetExhausted(
            f"{what} needs {self.held + nbytes} bytes of memory to check, more than the "
            f"proxy allows one request ({self.limit} bytes, {self.name})"
        )

    def _process_refusal(self, nbytes: int, what: str) -> ProcessBudgetFull:
        assert self.budget is not None
        return ProcessBudgetFull(
            f"{what} needs {nbytes} bytes of memory to check and the proxy's decoding "
            f"memory is in use by other requests ({self.budget.limit} bytes, "
            f"{self.budget.name}); retry later"
        )

    def give_back(self, nbytes: int) -> None:
        nbytes = min(nbytes, self.held)
        if nbytes <= 0:
            return
        self.held -= nbytes
        if self.budget is not None:
            self.budget.give_back(nbytes)

    def release(self) -> None:
        """Give back everything still held."""
        self.give_back(self.held)
