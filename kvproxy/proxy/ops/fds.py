"""Running out of file descriptors: recognised, said in those words, and made less likely.

Every client connection holds two descriptors (its own socket and its upstream one). At the
process's limit the operating system refuses the next socket with EMFILE (ENFILE when the whole
system is out), which used to read as "upstream unreachable", count as an upstream connect
failure and fail /readyz as if the broker were down. `FdExhaustion` says what it is instead, at
most once per interval however many connections it closes; `raise_open_file_limit` lifts the
soft limit to the hard one when `serve` starts, as servers such as nginx and Kafka's own scripts
expect the operator to.

uvloop (libuv) accepts and at once closes a connection it has no descriptor for, without telling
the program; `FdExhaustion.watch` therefore also checks, once a second, whether a descriptor can be
opened at all, so that refusals on accept are logged too.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
from collections.abc import Callable
from typing import Any

from kvproxy.proxy.ops.log_limits import LineLimit

__all__ = [
    "DEFAULT_MAX_CONNECTIONS_PER_LISTENER",
    "RESERVED_FDS",
    "FdExhaustion",
    "OutOfFileDescriptors",
    "at_fd_limit",
    "connections_allowed",
    "default_connections_per_listener",
    "describe",
    "open_fd_count",
    "open_file_limit_target",
    "out_of_fds",
    "raise_open_file_limit",
]

log = logging.getLogger("kvproxy")
_loop_errors = LineLimit("event loop error", logging.getLogger("asyncio"))
"""What asyncio's own handler writes (a callback's or a transport's error), limited: a peer can
make one per connection."""

_FD_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
LOG_INTERVAL_S = 10.0
"""At most one line per this many seconds, whatever the number of connections affected."""
WATCH_INTERVAL_S = 1.0

ExceptionHandler = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object]


class OutOfFileDescriptors(Exception):
    """No descriptor was left for a connection the proxy needed (already logged)."""


def at_fd_limit() -> bool:
    """Whether this process cannot open one more descriptor right now."""
    try:
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return exc.errno in _FD_ERRNOS
    os.close(fd)
    return False


def out_of_fds(exc: BaseException | None) -> bool:
    """Whether `exc` (a failed socket, connect or accept) means "no descriptor left". A name
    lookup at the limit fails as "Name or service not known" under uvloop: a lookup error counts
    when no descriptor can be opened either."""
    if not isinstance(exc, OSError):
        return False
    if exc.errno in _FD_ERRNOS:
        return True
    return isinstance(exc, socket.gaierror) and at_fd_limit()


def open_fd_count() -> int | None:
    """Descriptors open in this process; None when they cannot be counted (reading the list
    takes a descriptor too: at the limit, the caller knows the count is the limit)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir held
    except OSError:
        return None


def describe(exc: BaseException | None = None) -> str:
    """What is wrong and what to do, with the counts: `out of file descriptors (N open, limit
    M): raise the limit ...`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    count = open_fd_count()
    if isinstance(exc, OSError) and exc.errno == errno.ENFILE:
        here = f", {count} open in kvproxy" if count is not None else ""
        return (
            f"the system is out of file descriptors (ENFILE{here}, its limit {soft}): raise the "
            "system's limit (sysctl fs.file-max) or find what holds them"
        )
    opened = count if count is not None else soft  # at EMFILE every descriptor is taken
    room = "" if soft >= hard else f", or up to the hard limit {hard}"
    return (
        f"out of file descriptors ({opened} open, limit {soft}): raise the limit (ulimit -n; "
        f"LimitNOFILE= under systemd, ulimits under Docker{room}) or lower "
        "limits.max_connections_per_listener; every client connection holds two descriptors"
    )


class FdExhaustion:
    """Logs running out of descriptors at ERROR: the first time at once, then at most once per
    `LOG_INTERVAL_S` with the number of times since, so a flood of connections makes a line or
    two, not one per connection."""

    def __init__(self, interval: float = LOG_INTERVAL_S) -> None:
        self.interval = interval
        self.seen = 0
        """Times it happened (connections closed, probes failed), for tests and stats."""
        self._since_logged = 0
        self._logged_at = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self._handler: ExceptionHandler | None = None
        self._previous: ExceptionHandler | None = None

    def start(self) -> None:
        """Watch the running loop: its accept errors, and whether a descriptor can be opened."""
        loop = asyncio.get_running_loop()
        self._previous = loop.get_exception_handler()
        self._handler = self.accept_error_handler(self._previous)
        loop.set_exception_handler(self._handler)
        self._task = loop.create_task(self.watch(), name="kvproxy-fd-watch")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        loop = asyncio.get_running_loop()
        if self._handler is not None and loop.get_exception_handler() is self._handler:
            loop.set_exception_handler(self._previous)
        self._handler = None

    def report(self, what: str, exc: BaseException | None = None) -> None:
        """`what` the shortage caused, e.g. "closed the connection of client 10.0.0.7:51234"."""
        self.seen += 1
        self._since_logged += 1
        now = asyncio.get_running_loop().time()
        if now - self._logged_at < self.interval:
            return
        more = self._since_logged - 1
        since = f" ({more} more time(s) in the last {self.interval:.0f} s)" if more > 0 else ""
        log.error(
            "%s: %s%s",
            describe(exc),
            what,
            since,
            extra={"event": "out_of_file_descriptors", "times": self._since_logged},
        )
        self._since_logged = 0
        self._logged_at = now

    async def watch(self, interval: float = WATCH_INTERVAL_S) -> None:
        """Check once per `interval` that a descriptor can still be opened (see the module)."""
        while True:
            await asyncio.sleep(interval)
            if at_fd_limit():
                self.report("new client connections cannot be accepted")

    def accept_error_handler(self, previous: ExceptionHandler | None) -> ExceptionHandler:
        """An event loop exception handler that reports asyncio's "socket.accept() out of system
        resource" (EMFILE on accept) in these words, and passes anything else on."""

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            exc = context.get("exception")
            message = str(context.get("message", ""))
            if "accept" in message and isinstance(exc, BaseException) and out_of_fds(exc):
                self.report("new client connections wait until descriptors are free", exc)
            elif previous is not None:
                previous(loop, context)
            elif _loop_errors.take(logging.ERROR, lambda: message):
                loop.default_exception_handler(context)

        return handler


DEFAULT_MAX_CONNECTIONS_PER_LISTENER = 10_000
"""`limits.max_connections_per_listener` when unset and the open file limit allows it."""
RESERVED_FDS = 256
"""Descriptors kept for the proxy's own use beside client connections: its listeners (the
bootstrap and one per broker port in use), the metrics endpoint, the quarantine journal, schema
registry and metadata connections, the event loop's own."""


def open_file_limit_target() -> int:
    """The soft limit on open files `serve` raises this process's to: the hard limit (on macOS,
    where it can be unlimited, 1,048,576)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:  # Linux's hard limit is always a number
        return hard
    return max(soft, 1_048_576) if soft != resource.RLIM_INFINITY else soft


def connections_allowed(open_file_limit: int) -> int:
    """Client connections an open file limit has room for: two descriptors each (the client's
    socket and its upstream one), beside `RESERVED_FDS`."""
    return max(1, (open_file_limit - RESERVED_FDS) // 2)


def default_connections_per_listener() -> int:
    """An unset `limits.max_connections_per_listener`: 10,000, or fewer when the open file limit
    `serve` will run with has no room for them, so that a default config never runs out of
    descriptors before the count refuses a connection (and starts without a warning)."""
    return min(DEFAULT_MAX_CONNECTIONS_PER_LISTENER, connections_allowed(open_file_limit_target()))


def raise_open_file_limit() -> tuple[int, int, str | None]:
    """Lift this process's soft RLIMIT_NOFILE to its hard limit: (before, after, why not when
    it could not be raised). The default soft limit of many systems (1024) holds about 500 client
    connections; the hard one is what the operator allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = open_file_limit_target()
    if soft == target:
        return soft, soft, None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        return soft, soft, str(exc)
    return soft, target, None
