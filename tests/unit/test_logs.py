"""proxy.logs: the JSON line format and the rejection log's rate limit (with a fake clock)."""

from __future__ import annotations

import datetime
import io
import json
import logging
import sys
from typing import Any

import pytest

from proxy.logs import JsonFormatter, RejectionEvent, RejectionLogger, configure_logging


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
