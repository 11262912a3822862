"""Log lines whose number a peer chooses, bounded where they are written.

A client opening connections while the broker is down, a broker naming node after node at new
ports, a flood of undecodable frames: each event is worth a line, a thousand a second of them are
not. A `LineLimit` stands for one place in the code (or one reason it logs for): the first
`burst` lines of each `window_s` are written, the rest are counted, and once the window has
ended one line says how many were not written and what the last one said, at the place's next
line or when the timeout sweep calls `flush_ended` (every tick), whichever comes first.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_BURST", "DEFAULT_WINDOW_S", "LineLimit", "flush_ended", "start_afresh"]

DEFAULT_BURST = 5
"""Lines written per window before the rest are only counted."""

DEFAULT_WINDOW_S = 10.0

_limits: weakref.WeakSet[LineLimit] = weakref.WeakSet()


class LineLimit:
    """At most `burst` lines per `window_s` for one kind of line (`kind`, a fixed name, never a
    peer's), then one line of how many more there were."""

    def __init__(
        self,
        kind: str,
        logger: logging.Logger,
        *,
        burst: int = DEFAULT_BURST,
        window_s: float = DEFAULT_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kind = kind
        self._logger = logger
        self._burst = burst
        self._window_s = window_s
        self._clock = clock
        self._last = ""
        self._started = -window_s
        self._written = self._unwritten = 0
        self._level = logging.NOTSET
        _limits.add(self)

    def log(self, level: int, message: str, *args: Any, **options: Any) -> bool:
        """`logger.log(level, message, *args, **options)` unless this window's lines are spent;
        whether it was written. A line below the logger's level is neither written nor counted."""
        if not self.take(level, lambda: _words(message, args)):
            return False
        self._logger.log(level, message, *args, **options)
        return True

    def take(self, level: int, words: Callable[[], str]) -> bool:
        """Whether a line of `level` may be written now (the caller writes it, e.g. asyncio's
        own handler); if not, it is counted, `words()` being what the summary quotes."""
        if not self._logger.isEnabledFor(level):
            return False
        now = self._clock()
        if now - self._started >= self._window_s:
            self._end_window(now)
        if self._written < self._burst:
            self._written += 1
            return True
        self._unwritten += 1
        self._level = max(self._level, level)
        self._last = words()
        return False

    def forget(self) -> None:
        """A new window with nothing counted, as when it was made."""
        self._started = -self._window_s
        self._written = self._unwritten = 0
        self._level = logging.NOTSET

    def flush(self) -> None:
        """Say how many lines were not written if the window has ended."""
        now = self._clock()
        if self._unwritten and now - self._started >= self._window_s:
            self._end_window(now)

    def _end_window(self, now: float) -> None:
        if self._unwritten:
            self._logger.log(
                self._level,
                "%d more %s lines not written in %.0f s; the last: %s",
                self._unwritten,
                self.kind,
                now - self._started,
                self._last,
                extra={
                    "event": "log_lines_not_written",
                    "kind": self.kind,
                    "times": self._unwritten,
                },
            )
        self._started = now
        self._written = 0
        self._unwritten = 0
        self._level = logging.NOTSET


def _words(message: str, args: tuple[Any, ...]) -> str:
    """`message % args` as logging would make it, or the message itself where they do not fit
    (logging reports such a line; a summary just quotes it)."""
    try:
        return message % args if args else message
    except (TypeError, ValueError):
        return message


def start_afresh() -> None:
    """Every limit back to a new window with nothing counted (what was not written is
    forgotten): for one process running many proxies in turn, a test suite's."""
    for limit in list(_limits):
        limit.forget()


def flush_ended() -> None:
    """Every limit's count of unwritten lines whose window has ended (the sweep's tick)."""
    for limit in list(_limits):
        limit.flush()
