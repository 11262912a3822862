"""Whether the proxy is ready to serve: /readyz, the `kvproxy_ready` gauge and the start log.

Ready once the cluster has answered the proxy's Metadata request
(`kvproxy.proxy.cluster.metadata_refresh`
reports each answer and each failure here) and while a bootstrap server accepts a connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from kvproxy.journal import Journal
from kvproxy.proxy.ops.fds import FdExhaustion, out_of_fds
from kvproxy.proxy.ops.fds import describe as describe_fd_shortage
from kvproxy.proxy.ops.log_limits import LineLimit
from kvproxy.proxy.ops.metrics import ProxyMetrics

log = logging.getLogger("kvproxy")
_failures = LineLimit("cluster not answering", log)

READINESS_INTERVAL_S = 5.0
METADATA_RETRY_S = 1.0
"""Until the cluster first answers Metadata, how often the proxy asks again."""


class ClusterReadiness:
    """What the cluster last said to the proxy, and the readiness that follows from it."""

    def __init__(
        self,
        bootstrap: tuple[tuple[str, int], ...],
        connect_timeout_s: float,
        metrics: ProxyMetrics,
        fds: FdExhaustion,
        journal: Journal | None,
    ) -> None:
        self._bootstrap = bootstrap
        self._connect_timeout_s = connect_timeout_s
        self._metrics = metrics
        self._fds = fds
        self._journal = journal
        self._ready_cache: tuple[float, bool, str] = (0.0, False, "not checked yet")
        self._cluster_answer: str | None = None
        """What the first Metadata answer said; None until the cluster has answered."""
        self._cluster_problem: str | None = None

    @property
    def cluster_answered(self) -> bool:
        """Whether a bootstrap server has answered the proxy's Metadata request (or, closing
        the connection on it, ApiVersions)."""
        return self._cluster_answer is not None

    @property
    def cluster_problem(self) -> str | None:
        """Why the last Metadata request failed (None after an answer)."""
        return self._cluster_problem

    def answered(self, what: str, level: int = logging.INFO) -> None:
        """The cluster answered the proxy's Metadata request; `what` says how."""
        first = self._cluster_answer is None
        late = first and self._cluster_problem is not None
        self._cluster_answer = what
        self._cluster_problem = None
        if first:
            self._ready_cache = (float("-inf"), False, "")  # /readyz: check again now
        if late:  # serve logged "not ready" at start: say when that ended
            log.log(level, "kvproxy ready: %s", what)
        elif first and level > logging.INFO:
            log.log(level, "%s", what)

    def failed(self, problem: str) -> None:
        """No bootstrap server answered the proxy's Metadata request; `problem` says why."""
        if problem != self._cluster_problem:  # each new reason once, not every retry
            _failures.log(logging.WARNING, "%s", problem)  # a broker may vary its reasons
        self._cluster_problem = problem

    async def watch(self, refresh: Callable[[], Awaitable[bool]]) -> None:
        """Keep `kvproxy_ready` current even when nothing polls /readyz; until the cluster has
        answered a Metadata request, `refresh` (ask it again) every `METADATA_RETRY_S`.
        Runs until cancelled."""
        while True:
            if not self.cluster_answered:
                await refresh()
            await self.check()
            await asyncio.sleep(READINESS_INTERVAL_S if self.cluster_answered else METADATA_RETRY_S)

    async def check(self) -> tuple[bool, str]:
        """Ready once the cluster has answered the proxy's Metadata request and while at least
        one bootstrap server accepts a connection (checked at most once a second)."""
        loop = asyncio.get_running_loop()
        checked_at, ready, why = self._ready_cache
        if loop.time() - checked_at < 1.0:
            return ready, why
        if not self.cluster_answered:
            why = f"not ready: {self._cluster_problem or 'the cluster has not answered yet'}"
            self._ready_cache = (loop.time(), False, why)
            self._metrics.ready.set(0)
            return False, why
        ready, why = False, "no upstream reachable"
        timeout = min(1.0, self._connect_timeout_s)
        for host, port in self._bootstrap:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
            except (OSError, TimeoutError) as exc:
                if out_of_fds(exc):  # say so, rather than "no upstream reachable"
                    self._fds.report("the readiness check could not open a connection", exc)
                    why = f"not ready: {describe_fd_shortage(exc)}"
                    break
                continue
            writer.close()
            ready, why = True, f"ready: upstream {host}:{port} reachable"
            break
        if ready and self._journal is not None and self._journal.degraded:
            problem = self._journal.degraded
            why = f"ready, degraded: the quarantine journal cannot be written: {problem}"
        self._ready_cache = (loop.time(), ready, why)
        self._metrics.ready.set(1 if ready else 0)
        return ready, why
