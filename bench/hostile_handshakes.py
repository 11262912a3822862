"""Half-open TLS handshakes: what connections that send 10 bytes of a ClientHello and then
nothing cost the proxy, and what another client sees meanwhile.

Tansu, `kvproxy serve` from this file's checkout with an SNI listener (default limits unless
`--limits` gives some, as YAML: "{max_tls_handshakes: 1000}"). The hostile client opens
`--connections` connections (default 5,000) from 127.0.0.3 (`--addresses N`: spread over
127.0.1.3 ... 127.0.N.3) to the SNI port, each sending the
first 10 bytes of a ClientHello, and holds them `--hold` seconds (default 10); the other client of
`bench/hostile.py` (one small Produce at a time, from 127.0.0.2, on the plain bootstrap port)
runs throughout. The whole run is capped at 60 s of attack; this process raises its own open file
limit as far as it may.

Figures: connections the proxy closed while they were held (it refused or timed them out), the
proxy's file descriptors and resident memory before, at the peak and 5 s after the hostile
connections closed, and the other client's p50/p99 before and during.

    .venv/bin/python -m bench.hostile_handshakes [--connections 5000] [--hold 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import select
import socket
import ssl
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._brokers import create_topic, free_port, tansu
from bench._hostile_inputs import OTHER_TOPIC
from bench._hostile_watch import OtherClient
from bench._load import percentile
from bench._relays import start_proxy
from bench._results import report
from tests.harness.tls import make_tls_files

HOSTILE_HOST = "127.0.0.3"
ATTACK_CAP_S = 60.0


def client_hello_start(size: int = 10) -> bytes:
    """The first `size` bytes of a real ClientHello (record header, handshake header, ...)."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="bootstrap.kafka.localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()[:size]


def raise_open_file_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def fds_of(proxy: Any) -> int:
    return sum(p.num_fds() for p in proxy.processes())


def closed_by_peer(sock: socket.socket) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        return sock.recv(4096, socket.MSG_PEEK) == b""
    except OSError:
        return True


def attack(
    port: int, count: int, hold_s: float, proxy: Any, *, started: float, addresses: int
) -> dict[str, Any]:
    hello = client_hello_start()
    socks: list[socket.socket] = []
    refused_connect = 0
    peak_rss, peak_fds = 0, 0
    try:
        for n in range(count):
            if time.monotonic() - started > ATTACK_CAP_S:
                break
            sock = socket.socket()
            sock.bind((f"127.0.{1 + n % addresses}.3", 0) if addresses > 1 else (HOSTILE_HOST, 0))
            sock.settimeout(5)
            try:
                sock.connect(("127.0.0.1", port))
                sock.sendall(hello)
            except OSError:
                refused_connect += 1
                sock.close()
                continue
            socks.append(sock)
            if n % 500 == 0:
                peak_rss = max(peak_rss, proxy.rss_bytes())
                peak_fds = max(peak_fds, fds_of(proxy))
        hold_until = min(time.monotonic() + hold_s, started + ATTACK_CAP_S)
        while time.monotonic() < hold_until:
            peak_rss = max(peak_rss, proxy.rss_bytes())
            peak_fds = max(peak_fds, fds_of(proxy))
            time.sleep(0.5)
        closed = sum(closed_by_peer(sock) for sock in socks)
    finally:
        for sock in socks:
            sock.close()
    return {
        "opened": len(socks),
        "failed_to_connect": refused_connect,
        "closed_by_the_proxy_while_held": closed,
        "held_at_the_end": len(socks) - closed,
        "proxy_fds_peak": peak_fds,
        "proxy_rss_peak_mib": round(peak_rss / 2**20, 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    limit = raise_open_file_limit()
    with tansu() as server, tempfile.TemporaryDirectory() as tmp:
        create_topic(server.broker.bootstrap, OTHER_TOPIC)
        tls_dir = Path(tmp)
        with make_tls_files(tls_dir, hostnames=("*.kafka.localhost",)) as tls:
            sni_port = free_port()
            listen = (
                f", sni: {{port: {sni_port}, bootstrap: bootstrap.kafka.localhost, "
                f"brokers: 'broker-$(nodeId).kafka.localhost', "
                f"tls: {{cert_file: '{tls.server_cert}', key_file: '{tls.server_key}'}}}}"
            )
            extra = f"limits: {args.limits}\n" if args.limits else ""
            with start_proxy(server.broker.bootstrap, listen_yaml=listen, extra_yaml=extra) as p:
                other = OtherClient(p.port, timeout=30)
                other.start()
                time.sleep(3)
                quiet_end = time.perf_counter()
                rss_before, fds_before = p.rss_bytes(), fds_of(p)
                start = time.perf_counter()
                figures = attack(
                    sni_port,
                    args.connections,
                    args.hold,
                    p,
                    started=time.monotonic(),
                    addresses=args.addresses,
                )
                end = time.perf_counter()
                time.sleep(5)
                rss_after, fds_after = p.rss_bytes(), fds_of(p)
                other.stop()
                before = sorted(other.latencies(0, quiet_end))
                during = sorted(other.latencies(start, end))
    ms = 1000.0
    return {
        "connections": args.connections,
        "hold_s": args.hold,
        "addresses": args.addresses,
        "limits": args.limits or "defaults",
        "bench_open_file_limit": limit,
        **figures,
        "proxy_fds_before": fds_before,
        "proxy_fds_5s_after_close": fds_after,
        "proxy_rss_before_mib": round(rss_before / 2**20, 1),
        "proxy_rss_5s_after_close_mib": round(rss_after / 2**20, 1),
        "other_p50_before_ms": round(percentile(before, 0.5) * ms, 2) if before else None,
        "other_p50_during_ms": round(percentile(during, 0.5) * ms, 2) if during else None,
        "other_p99_during_ms": round(percentile(during, 0.99) * ms, 2) if during else None,
        "other_requests_during": len(during),
        "other_error": other.error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=5000)
    parser.add_argument("--hold", type=float, default=10.0)
    parser.add_argument("--limits", default="", help="YAML mapping")
    parser.add_argument("--addresses", type=int, default=1, help="from 127.0.N.3, N=1..")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report(run(args), args.json)


if __name__ == "__main__":
    main()
