"""SIGHUP while `kvproxy serve` starts or stops: queued, never the default action (which kills).

`serve`'s event loop handles SIGHUP while it runs (a reload); before the loop runs (imports,
reading the file, starting the embedded broker) and after it stops, this module's handler takes
it. It is tiny and imports nothing heavy, so the command line can install it first of all.
"""

from __future__ import annotations

import signal
import threading

_queued: list[int] = []
"""One entry per SIGHUP taken outside the event loop (a list: a signal handler only appends)."""


def _take(signum: int, frame: object) -> None:
    _queued.append(signum)  # logged by whoever takes the count: no logging in a signal handler


def queue_sighup() -> None:
    """From now on a SIGHUP is counted instead of killing the process. Main thread only (a
    no-op elsewhere, where Python cannot install signal handlers)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, _take)


def take_queued_sighups() -> int:
    """How many SIGHUPs came since the last call."""
    count = len(_queued)
    _queued.clear()
    return count
