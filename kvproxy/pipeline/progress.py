"""The audit's console: one line per stage, and on a terminal one updating line with the running
Spark stage's tasks; Spark's own output (its JVM's log lines and warnings, its Python workers'
stderr) goes to a file."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

__all__ = ["Progress", "spark_output_to"]

POLL_SECONDS = 0.5
"""How often the updating line asks Spark how far the running stage is."""


class Progress:
    """Progress lines on `out`: `[HH:MM:SS] message` per stage. When `out` is a terminal,
    `tasks()` keeps one line updated with the tasks done while a Spark job runs; elsewhere (a
    pipe, a file, a CI log) only the stage lines are written."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.updating = _is_terminal(out)
        self._lock = threading.Lock()
        self._pending = False  # an updating line is on screen, not yet ended

    def stage(self, message: str) -> None:
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        with self._lock:
            self._clear()
            print(f"[{stamp}] {message}", file=self.out, flush=True)

    def show_tasks(self, label: str, done: int, total: int) -> None:
        """The updating line (on a terminal only): `label: done/total tasks`."""
        if not self.updating:
            return
        with self._lock:
            self.out.write(f"\r\x1b[2K  {label}: {done}/{total} tasks")
            self.out.flush()
            self._pending = True

    def _clear(self) -> None:
        if self._pending:
            self.out.write("\r\x1b[2K")
            self._pending = False

    @contextlib.contextmanager
    def tasks(self, spark_context: Any, label: str) -> Iterator[None]:
        """While the block runs a Spark job, the updating line shows its tasks (terminal only)."""
        if not self.updating:
            yield
            return
        stop = threading.Event()
        tracker = spark_context.statusTracker()

        def poll() -> None:
            shown = (0, 0)
            while not stop.wait(POLL_SECONDS):
                done = total = 0
                for stage_id in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(stage_id)
                    if info is not None:
                        done += info.numCompletedTasks
                        total += info.numTasks
                if total and (done, total) != shown:
                    self.show_tasks(label, done, total)
                    shown = (done, total)

        thread = threading.Thread(target=poll, name="audit-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            with self._lock:
                self._clear()
                self.out.flush()


def _is_terminal(out: IO[str]) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def spark_output_to(path: Path) -> Iterator[IO[str]]:
    """While the block runs, this process's stderr (file descriptor 2) goes to `path`: a Spark
    JVM started in the block, and the Python workers it starts, write there for their lifetime.
    Yields a stream on the console's stderr, for the audit's own lines. A file it created and
    nothing was written to (Spark did not start) is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    sys.stderr.flush()
    console_fd = os.dup(2)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log_fd, 2)
    finally:
        os.close(log_fd)
    console = open(console_fd, "w", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    try:
        yield console
    finally:
        console.flush()
        sys.stderr.flush()
        os.dup2(console.fileno(), 2)
        console.close()
        if not existed and path.stat().st_size == 0:
            path.unlink()
