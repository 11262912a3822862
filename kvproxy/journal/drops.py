"""`Drops`: journal entries not kept, counted by reason and said at most once per interval."""

from __future__ import annotations

from collections.abc import Callable


class Drops:
    """Counts entries not kept (`entries`, `bytes`, `by_reason`: reason -> [entries, bytes]).

    A flood drops thousands of entries a second: one line per drop would flood the log too, so
    `say` is called at most once per `interval_s` (on a drop), with the entries and bytes not
    kept since the previous line.
    """

    def __init__(
        self, interval_s: float, clock: Callable[[], float], say: Callable[[str], None]
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._say = say
        self.entries = 0
        self.bytes = 0
        self.by_reason: dict[str, list[int]] = {}
        self._unsaid = [0, 0]
        self._said_at: float | None = None

    def count(self, reason: str, size: int, why: str) -> None:
        """One entry of `size` bytes not kept for `reason` (`why` explains it in the line)."""
        self.entries += 1
        self.bytes += size
        counts = self.by_reason.setdefault(reason, [0, 0])
        counts[0] += 1
        counts[1] += size
        self._unsaid[0] += 1
        self._unsaid[1] += size
        now = self._clock()
        if self._said_at is not None and now - self._said_at < self.interval_s:
            return
        self._said_at = now
        (entries, size_sum), self._unsaid = self._unsaid, [0, 0]
        self._say(
            f"quarantine journal cannot keep up: {entries} entries ({size_sum} bytes) not kept "
            f"since the last report: {why}"
        )
