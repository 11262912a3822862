"""`LineLimit`: the first lines of a window written, the rest counted and said in one line once
the window has ended, at the next line or when the sweep flushes."""

from __future__ import annotations

import logging

import pytest

from kvproxy.proxy.ops.log_limits import LineLimit, flush_ended


def _limit(now: list[float]) -> LineLimit:
    return LineLimit(
        "test line", logging.getLogger("kvproxy.test"), burst=3, window_s=10, clock=lambda: now[0]
    )


def test_the_lines_past_the_burst_are_counted_and_summed_up_at_the_next_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "kvproxy.test")
    now = [100.0]
    limit = _limit(now)
    written = [limit.log(logging.WARNING, "peer %d failed", n) for n in range(1000)]
    assert written == [True] * 3 + [False] * 997
    now[0] += 10
    assert limit.log(logging.WARNING, "peer %d failed", 1000)
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert said[:3] == [(logging.WARNING, f"peer {n} failed") for n in range(3)]
    assert said[3] == (
        logging.WARNING,
        "997 more test line lines not written in 10 s; the last: peer 999 failed",
    )
    assert said[4] == (logging.WARNING, "peer 1000 failed")
    summary = caplog.records[3]
    fields = (summary.event, summary.kind, summary.times)  # type: ignore[attr-defined]
    assert fields == ("log_lines_not_written", "test line", 997)


def test_the_sweep_says_what_was_not_written_once_the_window_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "kvproxy.test")
    now = [0.0]
    limit = _limit(now)
    for n in range(5):
        limit.log(logging.ERROR if n == 4 else logging.WARNING, "line %d", n)
    flush_ended()  # the window has not ended: nothing yet
    assert len(caplog.records) == 3
    now[0] = 10.0
    flush_ended()
    assert len(caplog.records) == 4
    assert caplog.records[3].levelno == logging.ERROR  # the highest level not written
    assert caplog.records[3].getMessage().startswith("2 more test line lines not written")
    flush_ended()
    assert len(caplog.records) == 4  # said once


def test_a_line_below_the_level_is_neither_written_nor_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "kvproxy.test")
    now = [0.0]
    limit = _limit(now)
    for _ in range(10):
        assert not limit.log(logging.DEBUG, "quiet")
    assert [limit.log(logging.WARNING, "loud") for _ in range(4)] == [True] * 3 + [False]


def test_what_cpython_would_print_as_ignored_is_a_log_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`sys.unraisablehook` as `configure_logging` installs it: an exception CPython would print
    to stderr ("Exception ignored in: ...") is an ERROR record with its traceback."""
    import io
    import sys
    import types

    from kvproxy.proxy.ops.logs import configure_logging, log_unraisable

    caplog.set_level(logging.WARNING, "kvproxy")
    hook, root = sys.unraisablehook, logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        configure_logging("json", stream=io.StringIO())
        assert sys.unraisablehook is log_unraisable
    finally:
        sys.unraisablehook = hook
        logging.captureWarnings(False)
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    try:
        raise OSError("in a finalizer")
    except OSError as exc:
        error = exc
    unraisable = types.SimpleNamespace(
        exc_type=OSError,
        exc_value=error,
        exc_traceback=error.__traceback__,
        err_msg=None,
        object="<a finalizer>",
    )
    log_unraisable(unraisable)
    [record] = [r for r in caplog.records if r.getMessage().startswith("Exception ignored in")]
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "Exception ignored in: '<a finalizer>'"
    assert record.exc_info is not None and record.exc_info[1] is error
