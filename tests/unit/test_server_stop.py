"""`ProxyServer.stop()` leaves nothing running behind it.

A watcher cancelled but not awaited stays a pending task; when the caller's loop then closes,
asyncio reports "Task was destroyed but it is pending!" from the garbage collector, in whatever
code runs next (an unrelated test once failed on that line in its captured log)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from kvproxy.proxy.serve.server import ProxyServer
from tests.harness.proxy import proxy_config, run_proxy
from tests.harness.tansu import free_port


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop])
def test_stop_leaves_no_task_of_the_server_pending(new_loop: object) -> None:
    # nothing listens on the upstream port: readiness keeps asking, so its watcher is mid-wait
    config = proxy_config(f"127.0.0.1:{free_port()}", metrics={"enabled": False})

    async def start_and_stop() -> list[asyncio.Task[object]]:
        server = ProxyServer(config)
        await server.start()
        await asyncio.sleep(0.05)
        await server.stop(drain_timeout=0.1)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    with asyncio.Runner(loop_factory=new_loop) as runner:  # type: ignore[arg-type]
        assert runner.run(start_and_stop()) == []


def test_the_harness_leaves_no_task_pending_when_its_loop_closes() -> None:
    config = proxy_config(f"127.0.0.1:{free_port()}", metrics={"enabled": False})
    with run_proxy(config=config) as proxy:
        straggler = asyncio.run_coroutine_threadsafe(asyncio.sleep(3600), proxy.loop)
    assert straggler.cancelled()
