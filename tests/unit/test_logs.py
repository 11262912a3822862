"""kvproxy.proxy.ops.logs: the JSON line format and the rejection log's rate limit (with a fake
clock)."""

from __future__ import annotations

import datetime
import io
import json
import logging
import sys
from typing import Any

import pytest

from kvproxy.proxy.ops.logs import JsonFormatter, RejectionEvent, RejectionLogger, configure_logging


def record(message: str, *args: object, **extra: Any) -> logging.LogRecord:
    made = logging.getLogger("kvproxy.test").makeRecord(
        "kvproxy.test", logging.WARNING, __file__, 1, message, args, None, extra=extra
    )
    made.created = 1_700_000_000.25
    return made


def test_json_line_has_time_level_logger_message_and_every_extra_field() -> None:
    line = JsonFormatter().format(
        record("rejected %s-%d", "orders", 3, topic="orders", partition=3, enforced=True)
    )
    assert "\n" not in line
    entry = json.loads(line)
    assert entry == {
        "time": "2023-11-14T22:13:20.250Z",
        "level": "WARNING",
        "logger": "kvproxy.test",
        "message": "rejected orders-3",
        "topic": "orders",
        "partition": 3,
        "enforced": True,
    }
    parsed = datetime.datetime.fromisoformat(entry["time"])
    assert parsed.utcoffset() == datetime.timedelta(0)


def test_json_line_carries_the_traceback_and_stringifies_odd_values() -> None:
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        made = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    made.__dict__["where"] = object()  # as `extra` would set it
    line = JsonFormatter().format(made)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "failed"
    assert entry["traceback"].startswith("Traceback (most recent call last):")
    assert "ValueError: boom\nsecond line" in entry["traceback"]
    assert entry["where"].startswith("<object object")


def test_configure_logging_json_writes_one_object_per_line() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("json", stream=stream)
        logging.getLogger("kvproxy").info("hello %s", "there", extra={"port": 9192})
        logging.getLogger("kvproxy").debug("not shown")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.captureWarnings(False)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert (entry["level"], entry["logger"], entry["message"], entry["port"]) == (
        "INFO",
        "kvproxy",
        "hello there",
        9192,
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def event(topic: str = "orders", partition: int = 0, code: int = 87) -> RejectionEvent:
    return RejectionEvent(
        topic=topic,
        partition=partition,
        policy="json",
        code=code,
        message="record 0: value is not JSON",
        client_id="app-1",
        client_address="127.0.0.1:5555",
        enforced=True,
    )


def rejection_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "kvproxy.rejections"]


def test_every_rejection_is_logged_once_with_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    RejectionLogger(clock=FakeClock()).rejected(event(partition=4))
    [line] = rejection_records(caplog)
    fields = {
        k: getattr(line, k)
        for k in (
            "topic",
            "partition",
            "policy",
            "code",
            "error",
            "error_message",
            "client_id",
            "client_address",
            "enforced",
        )
    }
    assert fields == {
        "topic": "orders",
        "partition": 4,
        "policy": "json",
        "code": 87,
        "error": "INVALID_RECORD",
        "error_message": "record 0: value is not JSON",
        "client_id": "app-1",
        "client_address": "127.0.0.1:5555",
        "enforced": True,
    }
    assert line.levelno == logging.WARNING


def test_rate_limit_per_key_and_summary_at_the_next_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    clock = FakeClock()
    logger = RejectionLogger(rate=3, window_s=60, clock=clock)
    for n in range(10):
        logger.rejected(event(partition=n))
        clock.now += 1
    logger.rejected(event(topic="other"))  # another key has its own budget
    logged = rejection_records(caplog)
    assert [(r.topic, r.partition) for r in logged] == [  # type: ignore[attr-defined]
        ("orders", 0),
        ("orders", 1),
        ("orders", 2),
        ("other", 0),
    ]
    assert not any(hasattr(r, "suppressed") for r in logged)

    caplog.clear()
    clock.now = 1000.0 + 59.5
    logger.flush()  # the window is not over yet
    assert rejection_records(caplog) == []

    clock.now = 1000.0 + 60
    logger.rejected(event(partition=42))  # the next window: summary first, then the line
    summary, line = rejection_records(caplog)
    assert summary.suppressed == 7  # type: ignore[attr-defined]
    assert (summary.topic, summary.policy, summary.code) == ("orders", "json", 87)  # type: ignore[attr-defined]
    assert summary.getMessage().startswith("7 more rejections of orders by policy json, code 87")
    assert "suppressed" in summary.getMessage()
    assert line.partition == 42  # type: ignore[attr-defined]


def test_flush_logs_the_summary_of_an_ended_window_without_a_new_rejection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    clock = FakeClock()
    logger = RejectionLogger(rate=1, window_s=60, clock=clock)
    for _ in range(3):
        logger.rejected(event())
    logger.rejected(event(topic="quiet"))  # nothing suppressed: no summary for it
    caplog.clear()
    clock.now += 61
    logger.flush()
    [summary] = rejection_records(caplog)
    assert (summary.topic, summary.suppressed) == ("orders", 2)  # type: ignore[attr-defined]
    caplog.clear()
    logger.flush()  # windows are gone: nothing twice
    assert rejection_records(caplog) == []


def test_flush_everything_at_shutdown(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    logger = RejectionLogger(rate=2, window_s=60, clock=FakeClock())
    for _ in range(5):
        logger.rejected(event())
    caplog.clear()
    logger.flush(everything=True)
    [summary] = rejection_records(caplog)
    assert summary.suppressed == 3  # type: ignore[attr-defined]


def configured(log_format: str) -> tuple[io.StringIO, Any]:
    """Route every record to a StringIO in `log_format`; returns (stream, restore)."""
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)

    def restore() -> None:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.captureWarnings(False)

    configure_logging(log_format, stream=stream)  # type: ignore[arg-type]
    return stream, restore


FORGED = "2024-01-01 00:00:00,000 INFO kvproxy: forged"


def hostile_event() -> RejectionEvent:
    return RejectionEvent(
        topic=f"orders\n{FORGED}",
        partition=0,
        policy="json",
        code=87,
        message="value is not JSON\r\x1b[2J",
        client_id=f"app\n{FORGED}\u2028x",
        client_address="127.0.0.1:5555",
        enforced=True,
    )


def test_text_format_escapes_control_characters_a_client_put_in_names() -> None:
    stream, restore = configured("text")
    try:
        RejectionLogger(clock=FakeClock()).rejected(hostile_event())
    finally:
        restore()
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    [line] = text.splitlines()  # also no U+2028 left to split at
    assert "rejected orders\\n2024-01-01 00:00:00,000 INFO kvproxy: forged-0" in line
    assert "value is not JSON\\r\\x1b[2J" in line
    assert "[client app\\n2024-01-01 00:00:00,000 INFO kvproxy: forged\\u2028x at" in line
    assert "\x1b" not in line


def test_text_format_leaves_tracebacks_and_backslashes_alone() -> None:
    stream, restore = configured("text")
    try:
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            logging.getLogger("kvproxy").exception("failed at C:\\temp\tnow")
    finally:
        restore()
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("kvproxy: failed at C:\\temp\\tnow")
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-2:] == ["ValueError: boom", "second line"]


def test_json_format_keeps_one_object_per_line_whatever_the_names_hold() -> None:
    stream, restore = configured("json")
    try:
        event = hostile_event()
        RejectionLogger(clock=FakeClock()).rejected(event)
        logging.getLogger("kvproxy").warning("seen %s", "a\u2029b\x85c")
    finally:
        restore()
    lines = stream.getvalue().splitlines()  # splits at U+2028, U+2029 and U+0085 too
    assert len(lines) == 2
    rejection, other = (json.loads(line) for line in lines)
    assert (rejection["topic"], rejection["client_id"]) == (event.topic, event.client_id)
    assert rejection["error_message"] == event.message
    assert other["message"] == "seen a\u2029b\x85c"


def test_a_line_is_bounded_whatever_the_length_of_names_and_messages(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    logger = RejectionLogger(rate=1, clock=FakeClock())
    huge = RejectionEvent(
        topic="t" * 32_000,
        partition=0,
        policy="json",
        code=87,
        message="m" * 100_000,
        client_id="c" * 32_000,
        client_address="127.0.0.1:5555",
        enforced=True,
    )
    logger.rejected(huge)
    logger.rejected(huge)  # suppressed: its summary names the topic too
    logger.flush(everything=True)
    line, summary = rejection_records(caplog)
    assert line.topic == "t" * 249 + f"...(+{32_000 - 249} chars)"  # type: ignore[attr-defined]
    assert line.client_id == "c" * 256 + f"...(+{32_000 - 256} chars)"  # type: ignore[attr-defined]
    message = line.error_message  # type: ignore[attr-defined]
    assert message == "m" * 2000 + f"...(+{100_000 - 2000} chars)"
    assert len(line.getMessage()) < 3_000
    assert summary.topic == line.topic  # type: ignore[attr-defined]
    assert len(summary.getMessage()) < 500


def test_lines_over_all_topics_are_limited_and_the_rest_counted_once_per_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    clock = FakeClock()
    logger = RejectionLogger(rate=10, window_s=60, clock=clock, total_rate=100)
    for n in range(2_000):  # a client inventing a topic name per batch
        logger.rejected(event(topic=f"invented-{n}"))
    logged = rejection_records(caplog)
    assert len(logged) == 100
    assert [r.topic for r in logged] == [f"invented-{n}" for n in range(100)]  # type: ignore[attr-defined]
    caplog.clear()
    logger.flush()  # the window is not over: nothing yet
    assert rejection_records(caplog) == []
    clock.now += 60
    logger.flush()
    [summary] = rejection_records(caplog)
    assert summary.event == "rejection_lines_suppressed"  # type: ignore[attr-defined]
    assert summary.suppressed == 1_900  # type: ignore[attr-defined]
    assert summary.getMessage().startswith(
        "1900 more rejections not logged in the last 60 s: more than 100 rejection lines over all "
        "topics"
    )
    caplog.clear()
    logger.rejected(event(topic="next"))  # a new window: lines again
    assert [r.topic for r in rejection_records(caplog)] == ["next"]  # type: ignore[attr-defined]


def test_per_key_windows_are_bounded_and_an_evicted_window_is_summed_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    logger = RejectionLogger(rate=1, clock=FakeClock(), total_rate=10_000, max_keys=1_000)
    logger.rejected(event(topic="first"))
    logger.rejected(event(topic="first"))  # suppressed in its window
    for n in range(2_500):
        logger.rejected(event(topic=f"invented-{n}"))
        assert len(logger._windows) <= 1_000
    assert len(logger._windows) == 1_000
    summaries = [r for r in rejection_records(caplog) if hasattr(r, "suppressed")]
    assert [(r.topic, r.suppressed) for r in summaries] == [("first", 1)]  # type: ignore[attr-defined]


def test_summaries_past_the_overall_limit_are_counted_in_the_overall_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    clock = FakeClock()
    logger = RejectionLogger(rate=1, window_s=60, clock=clock, total_rate=3)
    for topic in ("a", "b", "c"):
        for _ in range(4):
            logger.rejected(event(topic=topic))
    assert len(rejection_records(caplog)) == 3  # one line per key, 3 suppressed each
    caplog.clear()
    logger.flush(everything=True)  # no room for the three summaries: one line for all
    [summary] = rejection_records(caplog)
    assert (summary.event, summary.suppressed) == ("rejection_lines_suppressed", 9)  # type: ignore[attr-defined]
