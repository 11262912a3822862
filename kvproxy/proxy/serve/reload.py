"""Hot reload of the policy rules: on SIGHUP and when the config file changes.

The new file is loaded and validated, and its policy chains are built (custom classes imported,
schemas read) before anything is swapped; a file that fails any of that is refused with one ERROR
line naming the file and every problem with its line, and the rules in force stay. The reading,
parsing and building run on a thread of their own, so a large or hostile file never holds the
event loop (the file's bounds are in `kvproxy.settings.yaml_file`); only the swap runs on the loop.
On success the server's rules are replaced between two requests: a request already decided keeps its
verdict, the next one uses the new rules, and no connection is dropped. Sections that only take
effect at start (`listen`, `upstream`, `limits`, `shutdown`, ...) are reported with a WARNING and
not applied.

The file is watched by polling its (mtime, size, inode, device) every `poll_interval` seconds; an
editor that saves by renaming a new file over the old one is seen as well, and a file still being
written is read once it stops changing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from kvproxy.policies.api import Need
from kvproxy.policies.config import TopicRouting
from kvproxy.policies.errors import MAX_PROBLEMS_SHOWN, cut
from kvproxy.policies.producer_state import ProducerStateTracker
from kvproxy.proxy.config.proxy_config import (
    RELOADABLE_SECTIONS,
    ProxyConfig,
    load_config_and_rules,
)
from kvproxy.proxy.serve.server import ProxyServer
from kvproxy.settings.loading import ConfigError

log = logging.getLogger("kvproxy.reload")

ReloadResult = Literal["success", "failure"]
ReloadListener = Callable[[str], None]
"""Told the result of every reload attempt: "success" or "failure" (e.g. a metrics counter)."""

DEFAULT_POLL_INTERVAL = 1.0
SETTLE_S = 0.1
"""A changed file is read once it has not changed for this long (a save in progress)."""
RETIRE_GRACE_S = 30.0
"""How long replaced rules stay open: a request held for topic-config discovery was decided to
use them, and may still run them after the swap."""

FileSignature = tuple[int, int, int, int]


def file_signature(path: Path) -> FileSignature | None:
    """What changes when the file is written or replaced; None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)


def one_line(problem: str, path: Path) -> str:
    """A config error message as one log line, without the file name it starts with.

    YAML's messages quote the offending source line under each position and mark the column
    with `^`: the position (line, column) is kept, the quote dropped."""
    for prefix in (f"{path}: ", f"{path.resolve()}: "):
        if problem.startswith(prefix):
            problem = problem[len(prefix) :]
            break
    parts: list[str] = []
    quote_follows = False
    for raw in problem.splitlines():
        line = raw.strip()
        if not line or set(line) == {"^"}:
            continue
        if quote_follows:
            quote_follows = False
            continue
        position = _YAML_POSITION.fullmatch(line)
        if position:
            line, quote_follows = position.group(1), True
        parts.append(line.rstrip(":"))
    if not parts:
        return "unknown problem"
    return parts[0] + (": " + "; ".join(parts[1:]) if parts[1:] else "")


_YAML_POSITION = re.compile(r'in "[^"]*", (line \d+, column \d+):')


def error_line(error: ConfigError, path: Path) -> str:
    """A ConfigError as one log line, without the file name the log line gives already: every
    problem with its line number, or what one_line makes of a file that did not parse."""
    if not error.problems:
        return one_line(str(error), path)
    problems = [
        f"line {problem.line}: {problem.text}" if problem.line is not None else problem.text
        for problem in error.problems[:MAX_PROBLEMS_SHOWN]
    ]
    more = len(error.problems) - len(problems)
    if more:
        problems.append(f"... and {more} more problem(s)")
    return f"{len(error.problems)} problem(s): " + "; ".join(problems)


def sections_needing_restart(running: ProxyConfig, new: ProxyConfig) -> list[str]:
    return [
        name
        for name in type(new).model_fields
        if name not in RELOADABLE_SECTIONS and getattr(new, name) != getattr(running, name)
    ]


class ConfigReloader:
    """Reloads `server`'s rules from `path` on demand, on SIGHUP and when the file changes."""

    def __init__(
        self,
        server: ProxyServer,
        path: str | Path,
        *,
        base_dir: Path | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        on_result: ReloadListener | None = None,
        retire_grace: float = RETIRE_GRACE_S,
        loaded: FileSignature | Literal["now"] | None = "now",
    ) -> None:
        """`loaded`: the file's signature when the rules in force were read from it, so that a
        change made while the proxy was starting is reloaded too ("now": read it here)."""
        self.server = server
        self.path = Path(path)
        self.base_dir = base_dir if base_dir is not None else self.path.resolve().parent
        self.poll_interval = poll_interval
        self.on_result = on_result
        self.retire_grace = retire_grace
        self._signature = file_signature(self.path) if loaded == "now" else loaded
        self._missing_reported = False
        self._watch_task: asyncio.Task[None] | None = None
        self._sighup = False
        self._retired: dict[int, tuple[TopicRouting, asyncio.TimerHandle | None]] = {}
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = asyncio.Lock()  # one reload at a time (bound to a loop when first used)
        self._tasks: set[asyncio.Task[bool]] = set()
        self._waiting = False  # a reload is queued behind the one running

    # ---- lifecycle ----

    def start(self, *, sighup: bool = True) -> None:
        """Reload on SIGHUP (unless `sighup` is False: the caller routes it to `request_reload`) and
        (when `poll_interval` > 0) on a change of the file."""
        loop = asyncio.get_running_loop()
        if sighup:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGHUP, self.request_reload, "SIGHUP")
                self._sighup = True
        if self.poll_interval > 0:
            self._watch_task = loop.create_task(self.watch(), name="kvproxy-config-watch")

    async def stop(self) -> None:
        """Stop watching and reloading (the rules in force stay in force)."""
        if self._sighup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._sighup = False
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
            self._watch_task = None
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
            self._thread = None

    def close(self) -> None:
        """Close every replaced routing not closed yet (call once no request can use them)."""
        for routing, timer in list(self._retired.values()):
            if timer is not None:
                timer.cancel()
            self._close_retired(routing)

    # ---- watching ----

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            if file_signature(self.path) != self._signature:
                await self._settle()
                await self.check_file()

    async def _settle(self) -> None:
        """Let a writer finish: wait until the file looks the same on two checks in a row."""
        pause = min(self.poll_interval, SETTLE_S)
        last = file_signature(self.path)
        for _ in range(20):
            await asyncio.sleep(pause)
            now = file_signature(self.path)
            if now == last:
                return
            last = now

    async def check_file(self) -> bool | None:
        """Reload if the file changed since it was last read; None when nothing changed."""
        signature = file_signature(self.path)
        if signature == self._signature:
            return None
        if signature is None:
            if not self._missing_reported:
                log.warning("config file %s cannot be read: keeping the rules in force", self.path)
                self._missing_reported = True
            self._signature = None
            return None
        return await self.reload_off_loop("file change")

    # ---- reloading ----

    def request_reload(self, trigger: str = "request") -> None:
        """Reload in the background (a signal handler cannot wait). One reload runs at a time;
        requests that come meanwhile make one more, which reads the file as it is then."""
        if self._waiting:
            return
        self._waiting = bool(self._tasks)  # one runs: this one waits for it
        task = asyncio.get_running_loop().create_task(
            self._requested(trigger), name="kvproxy-config-reload"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def busy(self) -> bool:
        """Whether a reload that `request_reload` started runs or waits."""
        return bool(self._tasks)

    async def _requested(self, trigger: str) -> bool:
        async with self._lock:
            self._waiting = False  # from here on, a request makes one more
            return await self._reload_locked(trigger)

    async def reload_off_loop(self, trigger: str = "request") -> bool:
        """Load, validate and build the file on the reload thread, then swap the rules in;
        the event loop keeps serving meanwhile. False when refused."""
        async with self._lock:
            return await self._reload_locked(trigger)

    async def _reload_locked(self, trigger: str) -> bool:
        self._signature = file_signature(self.path)
        self._missing_reported = False
        if self._thread is None:
            self._thread = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="kvproxy-config"
            )
        state = self.server.routing.producer_state
        built = self._thread.submit(self._load, state, trigger)
        try:
            outcome = await asyncio.wrap_future(built)
        except asyncio.CancelledError:  # stopping: rules built after all are closed
            built.add_done_callback(_close_unused)
            raise
        if isinstance(outcome, str):
            return self._refuse(outcome, trigger)
        return self._apply(*outcome, trigger)

    def _load(
        self, state: ProducerStateTracker | None, trigger: str
    ) -> tuple[ProxyConfig, TopicRouting] | str:
        """The file's configuration and rules, or why it is refused (any thread)."""
        log.info(
            "config reload: reading %s (%s)",
            self.path,
            trigger,
            extra={"event": "config_reload_started", "file": str(self.path), "trigger": trigger},
        )
        try:
            return load_config_and_rules(self.path, self.base_dir, producer_state=state)
        except ConfigError as exc:
            return error_line(exc, self.path)
        except Exception as exc:  # a custom policy failing in a way it should have reported
            return f"building the policies failed: {cut(repr(exc))}"

    def _apply(self, config: ProxyConfig, routing: TopicRouting, trigger: str) -> bool:
        """Swap the rules in (on the event loop, between two requests)."""
        if self.server.schemas is None and routing.rules_needing(Need.SCHEMAS):
            routing.close()
            return self._refuse(
                "the schema policy needs the schema_registry section, which takes effect at "
                "the next start: restart the proxy to add it",
                trigger,
            )
        restart = sections_needing_restart(self.server.config, config)
        if restart:
            log.warning(
                "config reload: %s changed in %s and need%s a restart; applying the rest",
                ", ".join(restart),
                self.path,
                "s" if len(restart) == 1 else "",
                extra={"event": "config_reload_restart_needed", "sections": restart},
            )
        old = self.server.replace_rules(config, routing)
        self._retire(old)
        rules = sum(1 for _ in routing.rules)
        log.info(
            "config reloaded: %d topic rule%s (%s, %s)",
            rules,
            "" if rules == 1 else "s",
            self.path,
            trigger,
            extra={
                "event": "config_reload",
                "result": "success",
                "file": str(self.path),
                "trigger": trigger,
                "topic_rules": rules,
            },
        )
        self._report("success")
        return True

    def _refuse(self, problem: str, trigger: str) -> bool:
        log.error(
            "config reload refused: %s: %s (keeping the rules in force)",
            self.path,
            problem,
            extra={
                "event": "config_reload",
                "result": "failure",
                "file": str(self.path),
                "trigger": trigger,
                "problem": problem,
            },
        )
        self._report("failure")
        return False

    def _report(self, result: ReloadResult) -> None:
        if self.on_result is None:
            return
        try:
            self.on_result(result)
        except Exception:
            log.exception("reload listener failed")

    def _retire(self, routing: TopicRouting) -> None:
        timer: asyncio.TimerHandle | None = None
        if self.retire_grace > 0:
            with contextlib.suppress(RuntimeError):
                timer = asyncio.get_running_loop().call_later(
                    self.retire_grace, self._close_retired, routing
                )
        self._retired[id(routing)] = (routing, timer)
        if timer is None:
            self._close_retired(routing)

    def _close_retired(self, routing: TopicRouting) -> None:
        if self._retired.pop(id(routing), None) is not None:
            routing.close()


def _close_unused(built: concurrent.futures.Future[tuple[ProxyConfig, TopicRouting] | str]) -> None:
    """Close rules that a reload built after it was cancelled."""
    if built.cancelled() or built.exception() is not None:
        return
    outcome = built.result()
    if not isinstance(outcome, str):
        outcome[1].close()
