"""The decoding thread: where work too costly for the event loop runs, one piece at a time.

One thread, so heavy requests wait for each other while every other client's requests keep
flowing. Meanwhile the interpreter switches threads every `DECODING_SWITCH_INTERVAL_S` rather
than every 5 ms: the event loop gives up the GIL at every wait for I/O and must win it back each
time, so with CPU-bound decoding beside it every loop iteration could cost a whole switch
interval.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

DECODING_SWITCH_INTERVAL_S = 0.0005


class DecodingThread:
    """Runs work off the event loop (`run`), on one thread shared by the whole proxy."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="kvproxy-decode")
        self._running = 0
        """Pieces of work on the thread, running or queued."""
        self._switch_interval = sys.getswitchinterval()

    async def run(self, work: Callable[[], T]) -> T:
        """`work`'s result, computed on the decoding thread."""
        if self._running == 0:
            self._switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(DECODING_SWITCH_INTERVAL_S)
        self._running += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, work)
        finally:
            self._running -= 1
            if self._running == 0:
                sys.setswitchinterval(self._switch_interval)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
