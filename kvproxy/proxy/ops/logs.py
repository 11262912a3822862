"""kvproxy's log output: human-readable or JSON lines, and the rejection log.

Every rejection is logged once with its topic, partition, policy, code, message, client id and
client address, as structured fields (`extra`) so the JSON format carries them as keys. A client
that keeps sending bad batches cannot flood the log: at most `rate` lines per (topic, policy,
code) are written per window (60 s), and at most `total_rate` over all of them, since a client
can invent a new topic name for every batch; when a window ends with rejections left unwritten,
a summary line says how many (`suppressed`). Client-chosen strings are clipped
(`kvproxy.journal.bounds`),
so a line's length is bounded too.

Client-chosen strings can hold newlines and terminal escapes. The text format escapes every
control character of the message (`\\n`, `\\x1b`), so one record is one line whatever a client
put in a topic name or client id; the JSON format escapes them as JSON does.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, TextIO

from kvproxy.journal.bounds import MAX_CLIENT_ID_CHARS, MAX_MESSAGE_CHARS, MAX_TOPIC_CHARS, clip
from kvproxy.protocol.error_codes import error_name
from kvproxy.proxy.ops.log_limits import LineLimit

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

_ESCAPES: Final = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))},
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
    0x2028: "\\u2028",  # LINE SEPARATOR and PARAGRAPH SEPARATOR: line breaks to some readers
    0x2029: "\\u2029",
}


def escape_controls(text: str) -> str:
    """`text` with every control character written as an escape (`\\n`, `\\x1b`), so it cannot
    end a log line, start a forged one or drive a terminal. Backslashes are left as they are."""
    if text.isprintable():  # the common case: one C-level scan, nothing to escape
        return text
    return text.translate(_ESCAPES)


class TextFormatter(logging.Formatter):
    """The text format, with the message's control characters escaped (`escape_controls`).

    Tracebacks are left as they are: they span lines by design, and what they quote is the
    exception's text, not a field a client fills."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


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
        line = json.dumps(entry, default=str, ensure_ascii=False)
        # JSON leaves these raw inside strings; str.splitlines() and some log shippers break there
        if "\u2028" in line or "\u2029" in line or "\x85" in line:
            line = line.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
            line = line.replace("\x85", "\\u0085")
        return line


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
    formatter = JsonFormatter() if log_format == "json" else TextFormatter(text_format)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    if log_format == "json":
        logging.captureWarnings(True)  # warnings become records too: every line stays JSON
    sys.unraisablehook = log_unraisable


_proxy_log = logging.getLogger("kvproxy")
_server_names = LineLimit("TLS server name not ASCII", _proxy_log)
_unraisables = LineLimit("exception ignored", _proxy_log)


def log_unraisable(unraisable: Any) -> None:
    """`sys.unraisablehook`: what CPython would print to stderr as "Exception ignored in: ..."
    becomes a log record in the log's format, limited (`kvproxy.proxy.ops.log_limits`).

    A TLS client's server name that is not ASCII is one: CPython's server name callback cannot
    decode it, fails the handshake (an internal_error alert) before the proxy's callback runs,
    and reports the name's bytes; that is one warning line, the name clipped."""
    exc, what = unraisable.exc_value, unraisable.object
    if isinstance(what, bytes) and isinstance(exc, UnicodeDecodeError):
        _server_names.log(
            logging.WARNING,
            "TLS handshake refused: a client's server name is not ASCII (%s)",
            clip(repr(what), 120),
            extra={"event": "tls_server_name_not_ascii"},
        )
        return
    try:
        shown = clip(repr(what), 200)
    except Exception:  # an object whose repr fails: its type says enough
        shown = f"<{type(what).__name__}>"
    _unraisables.log(
        logging.ERROR,
        "%s: %s",
        unraisable.err_msg or "Exception ignored in",
        shown,
        exc_info=(unraisable.exc_type, exc, unraisable.exc_traceback),
    )


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
DEFAULT_TOTAL_RATE = 100
DEFAULT_WINDOW_S = 60.0
MAX_KEYS = 1000
"""(topic, policy, code) windows kept at once; the least recently rejected key's window is ended
early (its summary logged, or counted in the overall one) to make room for a new key."""

_Key = tuple[str, str, int]


class _Window:
    __slots__ = ("logged", "start", "suppressed")

    def __init__(self, start: float) -> None:
        self.start = start
        self.logged = 0
        self.suppressed = 0


class RejectionLogger:
    """Logs rejections: at most `rate` lines per (topic, policy, code) and `total_rate` lines in
    all (rejections and per-key summaries) per `window_s` seconds.

    Rejections over a key's rate are counted, and one summary line per key is logged when its
    window ends (at the next rejection of that key, when `max_keys` newer keys push it out, or at
    `flush()`, which `kvproxy serve` calls every few seconds and at shutdown). Lines over the
    total rate are counted instead, and one more line per window says how many. So at most
    `total_rate + 1` lines are written per window, each of bounded length
    (`kvproxy.journal.bounds`), and
    memory holds at most `max_keys` windows, however many topic names clients invent. `clock` is
    injectable for tests.
    """

    def __init__(
        self,
        rate: int = DEFAULT_RATE,
        window_s: float = DEFAULT_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        *,
        total_rate: int = DEFAULT_TOTAL_RATE,
        max_keys: int | None = None,
    ) -> None:
        self.rate = rate
        self.window_s = window_s
        self.clock = clock
        self.total_rate = total_rate
        self.max_keys = MAX_KEYS if max_keys is None else max_keys
        self._windows: OrderedDict[_Key, _Window] = OrderedDict()
        self._total = _Window(clock())
        """The window over all keys: `logged` lines written, `suppressed` rejections neither
        logged nor counted in a per-key summary line."""

    def rejected(self, event: RejectionEvent) -> None:
        now = self.clock()
        self._end_total_if_over(now)
        key = (clip(event.topic, MAX_TOPIC_CHARS), event.policy, event.code)
        window = self._windows.get(key)
        if window is not None and now - window.start >= self.window_s:
            self._end(key, window)
            window = None
        if window is None:
            while len(self._windows) >= self.max_keys:
                self._end(*next(iter(self._windows.items())))
            window = self._windows[key] = _Window(now)
        else:
            self._windows.move_to_end(key)
        if window.logged >= self.rate:
            window.suppressed += 1
            return
        if not self._take_line():
            return
        window.logged += 1
        self._log(event)

    def flush(self, everything: bool = False) -> None:
        """End every window that is over (every window with `everything`, e.g. at shutdown)."""
        now = self.clock()
        for key, window in list(self._windows.items()):
            if everything or now - window.start >= self.window_s:
                self._end(key, window)
        if everything:
            self._end_total(now)
        else:
            self._end_total_if_over(now)

    def _take_line(self) -> bool:
        """Whether one more line fits in the overall window (else it is counted as suppressed)."""
        total = self._total
        if total.logged >= self.total_rate:
            total.suppressed += 1
            return False
        total.logged += 1
        return True

    def _end_total_if_over(self, now: float) -> None:
        if now - self._total.start >= self.window_s:
            self._end_total(now)

    def _end_total(self, now: float) -> None:
        total, self._total = self._total, _Window(now)
        if not total.suppressed:
            return
        log.warning(
            "%d more rejections not logged in the last %g s: more than %d rejection lines over "
            "all topics (kvproxy_policy_rejections counts them all)",
            total.suppressed,
            self.window_s,
            self.total_rate,
            extra={
                "event": "rejection_lines_suppressed",
                "suppressed": total.suppressed,
                "window_s": self.window_s,
                "limit": self.total_rate,
            },
        )

    def _end(self, key: _Key, window: _Window) -> None:
        self._windows.pop(key, None)
        if not window.suppressed:
            return
        if not self._take_line():
            self._total.suppressed += window.suppressed - 1  # this summary counted once already
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
        topic = clip(event.topic, MAX_TOPIC_CHARS)
        message = clip(event.message, MAX_MESSAGE_CHARS)
        client_id = clip(event.client_id, MAX_CLIENT_ID_CHARS)
        log.warning(
            "%s %s-%d: policy %s, code %d (%s): %s [client %s at %s]",
            "rejected" if event.enforced else "would reject (warn mode)",
            topic,
            event.partition,
            event.policy,
            event.code,
            error_name(event.code),
            message,
            client_id,
            event.client_address,
            extra={
                "event": "rejection",
                "topic": topic,
                "partition": event.partition,
                "policy": event.policy,
                "code": event.code,
                "error": error_name(event.code),
                "error_message": message,
                "client_id": client_id,
                "client_address": event.client_address,
                "enforced": event.enforced,
            },
        )
