"""Whether the registry is known not to answer, so that lookups behind it fail fast.

Behind a registry that takes connections and never answers (a tarpit, a hung process), every
fresh schema id would wait the whole `timeout_ms` per URL, and every Produce request needing one
with it. After a lookup none of whose URLs answered at all, the registry is taken as silent for
`negative_cache_ttl_ms` (the time a failed lookup is trusted): fresh ids are answered as the
registry unavailable at once, without a request. After that time, the next fresh id starts one
probe of the registry (`PROBE_PATH`, beside the lookups: no Produce request waits for it), and
ids are still answered at once until an answer ends the silence.

An answer that counts as a failure (5xx, garbled, too large) does not make the registry
silent: it says something about one id, not that the registry is gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["RegistryHealth"]


class RegistryHealth:
    """The registry's silence as the catalog last saw it. Used on the event loop only."""

    def __init__(self, quiet_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.quiet_s = quiet_ms / 1000
        self._clock = clock
        self._silent_until = 0.0
        self._since = 0.0
        self._reason = ""
        self._probing = False

    def not_asked(self) -> str | None:
        """None when a lookup may ask the registry; otherwise why it is not asked (the
        registry is known silent), for its entry's reason."""
        if self._since == 0.0:
            return None
        ago_ms = (self._clock() - self._since) * 1000
        return (
            f"the registry has not answered for {ago_ms:.0f} ms ({self._reason}); "
            f"asked again at most every {self.quiet_s * 1000:.0f} ms"
        )

    def probe_due(self) -> bool:
        """True once per `quiet_s` of silence: the caller probes the registry, and ends the
        probe with `answered`, `unanswered` or `abandoned`."""
        if self._since == 0.0 or self._probing or self._clock() < self._silent_until:
            return False
        self._probing = True
        return True

    def answered(self) -> None:
        self._since = 0.0
        self._probing = False

    def unanswered(self, reason: str) -> None:
        if self.quiet_s <= 0:
            return
        now = self._clock()
        if self._since == 0.0:
            self._since = now
        self._silent_until = now + self.quiet_s
        self._reason = reason[:200]
        self._probing = False

    def abandoned(self) -> None:
        """The probe ended without an answer either way (cancelled): the next may start."""
        self._probing = False
