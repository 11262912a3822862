"""Every process the harness starts is stopped when pytest is stopped, not only in finalizers.

The brokers (Tansu, Kafka) and kvproxy run in sessions of their own (``start_new_session=True``,
so that a ^C in the terminal does not reach them before their fixture stops them): nothing stops
them but the harness. Finalizers do not run when pytest is killed by a signal, and a pytest-xdist
worker gets no signal at all when its controller is stopped (``kill PID``, a CI timeout, ``make``
forwarding SIGTERM): it only notices, later, that its controller is gone.

So every started process is registered (:func:`register`, right after ``Popen``), and
:func:`install` (``pytest_configure`` in ``tests/conftest.py``, once per process) arranges that
every registered process, or its whole process group, is sent SIGKILL:

* on SIGTERM, SIGINT and SIGHUP; the signal is then passed on to this process's other children
  (an xdist controller's workers, which do the same with their brokers; a process a test started
  itself), as a signal to the terminal's process group would have reached them, and has its
  previous effect here (SIGINT: a KeyboardInterrupt and pytest's teardown; SIGTERM, SIGHUP: the
  process dies of it);
* in a pytest-xdist worker, as soon as its controller is gone (its parent pid changes, checked
  by a watchdog thread every :data:`WATCH_INTERVAL` s; a thread, so it does not depend on the main
  thread returning to Python code); the worker then stops itself with SIGTERM;
* at interpreter exit (``atexit``), for whatever is still running then.

A process the harness has already reaped (``Popen.returncode`` set) is never signalled: its pid
may be another process's by then. No ``preexec_fn`` and no ``PR_SET_PDEATHSIG``: the test process
has threads (a preexec_fn is unsafe there, and the death signal follows the *thread* that started
the child, which a thread pool ends at any time).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
import time
from types import FrameType
from typing import Any, Final, TypeVar

__all__ = ["WATCH_INTERVAL", "install", "kill_all", "register", "registered"]

WATCH_INTERVAL: Final = 0.2
"""Seconds between two looks of an xdist worker's watchdog at its parent pid."""
SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

P = TypeVar("P", bound="subprocess.Popen[Any]")

_started: dict[int, tuple[subprocess.Popen[Any], bool]] = {}
"""pid -> (process, whether to kill its process group rather than the process). Plain dict
operations only (atomic): a signal handler or the watchdog thread may read it at any moment, so a
lock could deadlock."""
_previous: dict[int, Any] = {}
_owner: list[int] = []
"""The pid of the process that installed the handlers: a forked child inherits them, and the
registry, but kills nothing of its parent's."""
_installed = threading.Event()
_orphaned = threading.Event()
"""Set by the watchdog once the parent is gone."""


def register(proc: P, *, group: bool = True) -> P:
    """Remember ``proc`` to be killed if pytest is stopped; returns it. ``group``: it was started
    with ``start_new_session=True`` and leads its own process group, killed as a whole (the
    workers of a kvproxy supervisor with it); otherwise the process alone."""
    for pid, (known, _) in list(_started.items()):
        if known.returncode is not None:
            _started.pop(pid, None)
    _started[proc.pid] = (proc, group)
    if _orphaned.is_set():  # the watchdog already ran: nobody is waiting for this one
        kill_all()
    return proc


def registered() -> list[subprocess.Popen[Any]]:
    """The registered processes the harness has not reaped yet."""
    return [proc for proc, _ in list(_started.values()) if proc.returncode is None]


def kill_all() -> list[int]:
    """SIGKILL to every registered process (or group) not yet reaped, then a bounded (1 s) wait to
    reap them; the pids signalled. Safe in a signal handler and from any thread: no lock, and
    ``poll()`` only (the main thread may be inside a ``wait()`` of its own)."""
    killed: list[int] = []
    if _owner and _owner[0] != os.getpid():
        return killed
    for pid, (proc, group) in list(_started.items()):
        if proc.returncode is not None:
            continue
        try:
            if group:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
        killed.append(pid)
    deadline = time.monotonic() + 1.0
    waiting = [proc for proc, _ in list(_started.values()) if proc.pid in killed]
    while waiting and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            waiting = [proc for proc in waiting if proc.poll() is None]
        if waiting:
            time.sleep(0.01)
    return killed


def _pass_on(signum: int) -> None:
    """``signum`` to this process's children that are not registered (those are killed)."""
    with contextlib.suppress(Exception):
        import psutil

        for child in psutil.Process().children():
            if child.pid not in _started:
                with contextlib.suppress(psutil.Error, OSError):
                    child.send_signal(signum)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _owner == [os.getpid()]:
        kill_all()
        _pass_on(signum)
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):  # SIGINT's default_int_handler: KeyboardInterrupt, pytest's teardown
        previous(signum, frame)
        return
    # SIG_DFL (or None: installed outside Python): die of the signal, as without this handler
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_INTERVAL)
    _orphaned.set()
    kill_all()
    os.kill(os.getpid(), signal.SIGTERM)  # nobody will read this worker's results


def install(*, watch_parent: bool = False) -> None:
    """Install the signal handlers and the atexit hook (once per process, from the main thread);
    ``watch_parent``: also stop everything, and this process, when its parent is gone (an xdist
    worker's controller)."""
    if _installed.is_set():
        return
    _installed.set()
    _owner.append(os.getpid())
    for signum in SIGNALS if threading.current_thread() is threading.main_thread() else ():
        previous = signal.getsignal(signum)
        if previous == signal.SIG_IGN:  # nohup, or a parent that wants it ignored
            continue
        _previous[signum] = previous
        signal.signal(signum, _on_signal)
    atexit.register(kill_all)
    if watch_parent:
        threading.Thread(
            target=_watch_parent, args=(os.getppid(),), name="harness-parent-watch", daemon=True
        ).start()
