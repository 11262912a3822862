"""Running out of file descriptors, as the proxy reports it: one line per interval whatever the
number of connections, asyncio's own accept error in the same words, and the cases that are
not a shortage left alone."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket

import pytest

from kvproxy.proxy.ops.fds import FdExhaustion, at_fd_limit, describe, out_of_fds


def test_a_flood_makes_one_line_then_a_count(caplog: pytest.LogCaptureFixture) -> None:
    async def flood() -> None:
        shortage = FdExhaustion(interval=3600)
        exc = OSError(errno.EMFILE, "Too many open files")
        for n in range(500):
            shortage.report(f"closed the connection of client 10.0.0.1:{n}", exc)
        assert shortage.seen == 500
        shortage.interval = 0  # the interval has passed
        shortage.report("closed the connection of client 10.0.0.1:9999", exc)

    with caplog.at_level(logging.ERROR, logger="kvproxy"):
        asyncio.run(flood())
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    first, second = (record.getMessage() for record in caplog.records)
    assert first.startswith("out of file descriptors (")
    assert f" open, limit {soft}): raise the limit (ulimit -n; " in first
    assert first.endswith(
        "every client connection holds two descriptors: closed the connection of client 10.0.0.1:0"
    )
    assert second.endswith("client 10.0.0.1:9999 (499 more time(s) in the last 0 s)")


def test_asyncio_accept_errors_are_reported_in_the_same_words(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What asyncio's selector loop calls when accept() fails with EMFILE (uvloop closes such
    connections itself: the watch notices those)."""
    passed_on: list[str] = []

    async def accept_fails() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: passed_on.append(context["message"]))
        shortage = FdExhaustion()
        shortage.start()
        loop.call_exception_handler(
            {
                "message": "socket.accept() out of system resource",
                "exception": OSError(errno.EMFILE, "Too many open files"),
            }
        )
        loop.call_exception_handler({"message": "something else", "exception": ValueError()})
        shortage.stop()
        loop.call_exception_handler({"message": "after stop"})

    with caplog.at_level(logging.ERROR, logger="kvproxy"):
        asyncio.run(accept_fails())
    [record] = [r for r in caplog.records if r.name.startswith("kvproxy")]
    assert record.getMessage().startswith("out of file descriptors (")
    assert record.getMessage().endswith(": new client connections wait until descriptors are free")
    assert passed_on == ["something else", "after stop"]


def test_the_system_wide_shortage_is_named_as_such() -> None:
    text = describe(OSError(errno.ENFILE, "Too many open files in system"))
    assert text.startswith("the system is out of file descriptors (ENFILE, ")
    assert "sysctl fs.file-max" in text


def test_other_failures_are_not_a_shortage() -> None:
    assert not out_of_fds(ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
    assert not out_of_fds(TimeoutError())
    assert not out_of_fds(socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    assert out_of_fds(OSError(errno.EMFILE, "Too many open files"))
    assert not at_fd_limit()


def test_a_failed_name_lookup_at_the_limit_is_a_shortage() -> None:
    """uvloop's lookup at the limit fails as "Name or service not known"."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.dup(0)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        at_limit = at_fd_limit()
        lookup = out_of_fds(socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert at_limit and lookup
