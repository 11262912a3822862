"""Freed large buffers go back to the OS (glibc's mmap threshold fixed by the proxy at start)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BURST = textwrap.dedent(
    """
    import sys
    from kvproxy.proxy.ops.memory import return_large_buffers_to_the_os
    if sys.argv[1] == "fixed":
        assert return_large_buffers_to_the_os()
    def rss():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096
    kept = []
    base = rss()
    for _ in range(3):  # a burst of 4 MiB request buffers, small objects allocated meanwhile
        buffers = []
        for _ in range(50):
            buffers.append(bytearray(4 * 1024 * 1024))
            kept.append(bytes(100))
        kept.append(buffers[-1])  # one still in use (a pooled buffer, a frame being sent)
        del buffers
    print((rss() - base) // (1024 * 1024))
    """
)


def retained_mib(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", BURST, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


def test_a_burst_of_large_buffers_is_given_back_after_it() -> None:
    assert retained_mib("default") > 100  # glibc's own behaviour: the burst's peak stays
    assert retained_mib("fixed") < 32  # the three buffers still in use, and no more
