"""Hot reload of the policy rules: on SIGHUP and when the config file changes.

The new file is loaded and validated, and its policy chains are built (custom classes imported,
schemas read) before anything is swapped; a file that fails any of that is refused with one ERROR
line naming the file and every problem with its line, and the rules in force stay. On success the
server's rules are replaced between two requests: a request already decided keeps its verdict, the
next one uses the new rules, and no connection is dropped. Sections that only take effect at start
(`listen`, `upstream`, `limits`, `shutdown`, ...) are reported with a WARNING and not applied.

The file is watched by polling its (mtime, size, inode, device) every `poll_interval` seconds; an
editor that saves by renaming a new file over the old one is seen as well, and a file still being
written is read once it stops changing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from policies.config import TopicRouting
from proxy.config import ConfigError, ProxyConfig, load_config_and_rules
from proxy.server import ProxyServer

log = logging.getLogger("kvproxy.reload")

ReloadResult = Literal["success", "failure"]
ReloadListener = Callable[[str], None]
"""Told the result of every reload attempt: "success" or "failure" (e.g. a metrics counter)."""

RELOADABLE_SECTIONS = frozenset({"errors", "reject", "defaults", "topics", "topic_configs"})
"""What `ProxyServer.replace_rules` applies live; every other section needs a restart."""

DEFAULT_POLL_INTERVAL = 1.0
SETTLE_S = 0.1
"""A changed file is read once it has not changed for this long (a save in progress)."""
RETIRE_GRACE_S = 30.0
"""How long replaced rules stay open: a request held for topic-config discovery was decided to
use them, and may still run them after the swap."""

_Signature = tuple[int, int, int, int]


def file_signature(path: Path) -> _Signature | None:
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
        for problem in error.problems
    ]
    return f"{len(problems)} problem(s): " + "; ".join(problems)


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
    ) -> None:
        self.server = server
        self.path = Path(path)
        self.base_dir = base_dir if base_dir is not None else self.path.resolve().parent
        self.poll_interval = poll_interval
        self.on_result = on_result
        self.retire_grace = retire_grace
        self._signature = file_signature(self.path)
        self._missing_reported = False
        self._watch_task: asyncio.Task[None] | None = None
        self._sighup = False
        self._retired: dict[int, tuple[TopicRouting, asyncio.TimerHandle | None]] = {}

    # ---- lifecycle ----

    def start(self, *, sighup: bool = True) -> None:
        """Reload on SIGHUP (unless `sighup` is False: the caller routes it to `reload`) and
        (when `poll_interval` > 0) on a change of the file."""
        loop = asyncio.get_running_loop()
        if sighup:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGHUP, self.reload, "SIGHUP")
                self._sighup = True
        if self.poll_interval > 0:
            self._watch_task = loop.create_task(self.watch(), name="kvproxy-config-watch")

    async def stop(self) -> None:
        """Stop watching (the rules in force stay in force)."""
        if self._sighup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._sighup = False
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
            self._watch_task = None

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
                self.check_file()

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

    def check_file(self) -> bool | None:
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
        return self.reload("file change")

    # ---- reloading ----

    def reload(self, trigger: str = "request") -> bool:
        """Load, validate and build the file, then swap the rules; False when refused."""
        self._signature = file_signature(self.path)
        self._missing_reported = False
        try:
            config, routing = load_config_and_rules(
                self.path, self.base_dir, producer_state=self.server.routing.producer_state
            )
        except ConfigError as exc:
            return self._refuse(error_line(exc, self.path), trigger)
        except Exception as exc:  # a custom policy failing in a way it should have reported
            return self._refuse(f"building the policies failed: {exc!r}", trigger)
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
