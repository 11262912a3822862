"""kvproxy's log output: human-readable or JSON lines, and the rejection log.

Every rejection is logged once with its topic, partition, policy, code, message, client id and
client address, as structured fields (`extra`) so the JSON format carries them as keys. A client
that keeps sending bad batches cannot flood the log: at most `rate` lines per (topic, policy,
code) are written per window (60 s), and when a window ends with rejections left unwritten one
summary line says how many (`suppressed`).
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TextIO

from protocol.error_codes import error_name

log = logging.getLogger("kvproxy.rejections")

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_RECORD_ATTRIBUTES = frozenset(
    {
        *logging.LogRecord("", 0, "", 0, "", None, None).__dict__,
        "message",
        "asctime",
        "taskName",
    }
)
"""What every LogRecord has; anything else on a record came from `extra`."""


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message, every `extra`
    field of the record, and `traceback` / `stack` when the record carries them."""

    def format(self, record: logging.LogRecord) -> str:
        created = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        entry: dict[str, Any] = {
            "time": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["traceback"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class _WorkerField(logging.Filter):
    """Marks every record with the worker that wrote it (`serve --workers N`)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.index
        return True


def configure_logging(
    log_format: LogFormat = "text",
    level: int = logging.INFO,
    stream: TextIO | None = None,
    *,
    worker: int | None = None,
) -> None:
    """Send every log record to `stream` (stderr) in `log_format`; replaces earlier handlers.

    A worker of `serve --workers N` names itself: `worker` in JSON, `[worker i]` in text."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    text_format = TEXT_FORMAT
    if worker is not None:
        handler.addFilter(_WorkerField(worker))
        text_format = TEXT_FORMAT.replace("%(name)s:", "%(name)s[worker %(worker)s]:")
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(text_format)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    if log_format == "json":
        logging.captureWarnings(True)  # warnings become records too: every line stays JSON


@dataclass(frozen=True, slots=True)
class RejectionEvent:
    topic: str
    partition: int
    policy: str
    code: int
    message: str | None
    client_id: str | None
    client_address: str
    enforced: bool
    """False in warn mode: the batch was forwarded, the rejection only logged and counted."""


DEFAULT_RATE = 10
DEFAULT_WINDOW_S = 60.0

_Key = tuple[str, str, int]


class _Window:
    __slots__ = ("logged", "start", "suppressed")

    def __init__(self, start: float) -> None:
        self.start = start
        self.logged = 0
        self.suppressed = 0


class RejectionLogger:
    """Logs rejections: at most `rate` lines per (topic, policy, code) per `window_s` seconds.

    Rejections over the rate are counted, and one summary line per key is logged when its window
    ends (at the next rejection of that key, or at `flush()`, which `kvproxy serve` calls every few
    seconds and at shutdown). `clock` is injectable for tests.
    """

    def __init__(
        self,
        rate: int = DEFAULT_RATE,
        window_s: float = DEFAULT_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.window_s = window_s
        self.clock = clock
        self._windows: dict[_Key, _Window] = {}

    def rejected(self, event: RejectionEvent) -> None:
        now = self.clock()
        key = (event.topic, event.policy, event.code)
        window = self._windows.get(key)
        if window is not None and now - window.start >= self.window_s:
            self._end(key, window)
            window = None
        if window is None:
            window = self._windows[key] = _Window(now)
        if window.logged >= self.rate:
            window.suppressed += 1
            return
        window.logged += 1
        self._log(event)

    def flush(self, everything: bool = False) -> None:
        """End every window that is over (every window with `everything`, e.g. at shutdown)."""
        now = self.clock()
        for key, window in list(self._windows.items()):
            if everything or now - window.start >= self.window_s:
                del self._windows[key]
                self._end(key, window)

    def _end(self, key: _Key, window: _Window) -> None:
        self._windows.pop(key, None)
        if not window.suppressed:
            return
        topic, policy, code = key
        log.warning(
            "%d more rejections of %s by policy %s, code %d (%s) suppressed "
            "(at most %d logged per %g s)",
            window.suppressed,
            topic,
            policy,
            code,
            error_name(code),
            self.rate,
            self.window_s,
            extra={
                "event": "rejections_suppressed",
                "topic": topic,
                "policy": policy,
                "code": code,
                "error": error_name(code),
                "suppressed": window.suppressed,
                "window_s": self.window_s,
            },
        )

    @staticmethod
    def _log(event: RejectionEvent) -> None:
        log.warning(
            "%s %s-%d: policy %s, code %d (%s): %s [client %s at %s]",
            "rejected" if event.enforced else "would reject (warn mode)",
            event.topic,
            event.partition,
            event.policy,
            event.code,
            error_name(event.code),
            event.message,
            event.client_id,
            event.client_address,
            extra={
                "event": "rejection",
                "topic": event.topic,
                "partition": event.partition,
                "policy": event.policy,
                "code": event.code,
                "error": error_name(event.code),
                "error_message": event.message,
                "client_id": event.client_id,
                "client_address": event.client_address,
                "enforced": event.enforced,
            },
        )
