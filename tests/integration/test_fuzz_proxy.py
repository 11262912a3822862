"""Fuzzing the running proxy: mutated and random requests over many raw connections.

One in-process proxy (`run_proxy`) stands in front of the recording stub cluster
(`run_stub_cluster`). `KVPROXY_FUZZ_INPUTS` inputs (default 10,000; `make fuzz` runs 100,000) from
`tests.harness.fuzz` (seed `KVPROXY_FUZZ_SEED`) are sent over raw sockets, several connections at
a time; a connection carries inputs one after another for as long as the proxy keeps it open.

What the run proves, for every input:

* no hang: the proxy answers every request it should (`fuzz.expected_answers`) or closes the
  connection within `HANG_TIMEOUT_S`;
* well-formed answers: every answer frame is whole (its size prefix matches), carries the
  correlation id of the next request that expects one, in request order, and decodes with the
  project codec for the request's api key and version;
* no crash: the proxy's event loop reports no exception from any callback or task, no
  connection is closed for an internal error, no policy crashes;

and, for the run as a whole:

* nothing malformed upstream: every frame the stub received passes `fuzz.check_forwarded`
  (Produce requests decode cleanly and hold only valid batches, and the stub did not close on
  them; every other frame is byte for byte one a client sent, or one of the proxy's own);
* nothing left behind: after each chunk of inputs, once the clients are gone, the proxy holds no
  client connection, upstream connection or task (`wait_until_idle`);
* memory returns to its baseline (see `test_fuzz_proxy` for the measure and the tolerance);
* the proxy still serves: an ApiVersions request and a valid Produce request through it succeed.

A failure prints the seed and index of each failing input and its bytes; `python -m
tests.harness.fuzz SEED INDEX` prints an input again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import gc
import logging
import multiprocessing
import os
import pickle
import socket
import struct
import sys
import time
import traceback
import tracemalloc
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Final

import uvloop

from kvproxy.protocol.compression import MAX_DECOMPRESSED_BYTES, Codec, compress
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.messages import API_VERSIONS, PRODUCE, decode_response
from kvproxy.protocol.records import build_batch
from kvproxy.proxy.relay.response_slots import MAX_SILENT_SLOTS
from tests.harness import fuzz
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.raw_client import RawClientError, RawKafkaClient
from tests.harness.stub_upstream import STUB_API_VERSIONS, StubCluster, run_stub_cluster

INPUTS: Final = int(os.environ.get("KVPROXY_FUZZ_INPUTS", "10000"))
SEED: Final = int(os.environ.get("KVPROXY_FUZZ_SEED", "20261122"))
CONCURRENCY: Final = 16
CHUNK: Final = 2000
HANG_TIMEOUT_S: Final = 10.0
MAX_REUSE: Final = 32
"""Inputs one connection carries at most before the client closes it."""
MAX_FAILURES: Final = 20
STUB_PRODUCE: Final = range(STUB_API_VERSIONS[PRODUCE][0], STUB_API_VERSIONS[PRODUCE][1] + 1)
REPLAY: Final = 500
"""Inputs sent again, twice, after the run: the memory measure (see `test_fuzz_proxy`)."""
REPLAY_BLOCK_TOLERANCE: Final = 250
SETTLE_TRIES: Final = 10
"""Measurements after the replay, one second apart, before a growth counts as a leak: a leak
stays, while the futures and callbacks of requests a loaded machine has not finished yet go (a
fresh-clone run at load 7 read +429 blocks after three tries; quiet runs read +128 to +217 at
once)."""
REPLAY_RSS_TOLERANCE: Final = 64 * 1024 * 1024
"""The proxy's buffer pool may keep up to 64 MiB of large-frame buffers for reuse
(`kvproxy.protocol.framing.BufferPool`); the allocators keep freed arenas."""

_SIZE = struct.Struct(">i")


@dataclasses.dataclass
class Tally:
    """What the run saw; `summary()` is the line docs/reliability.md quotes."""

    inputs: int = 0
    connections: int = 0
    answers: int = 0
    proxy_closes: int = 0
    client_closes: int = 0
    forwarded: int = 0
    stub_closes_opaque: int = 0
    mutators: Counter[str] = dataclasses.field(default_factory=Counter)
    failures: list[str] = dataclasses.field(default_factory=list)

    def fail(self, item: fuzz.FuzzInput | None, what: str) -> None:
        where = item.describe() if item is not None else "(the run)"
        self.failures.append(f"{what}\n    {where}")

    def summary(self, seconds: float) -> str:
        return (
            f"fuzz: inputs={self.inputs} connections={self.connections} answers={self.answers} "
            f"closes={self.proxy_closes} (client closes {self.client_closes}) "
            f"frames_forwarded={self.forwarded} seed={SEED} seconds={seconds:.1f}"
        )


# ---- input generation, in a process of its own (the second core) ------------------------------


def _generate(seed: int, start: int, stop: int, max_frame: int) -> bytes:
    """Inputs `start`..`stop` with their expectations, pickled: one object while it waits, so
    a chunk generated ahead does not show in the memory figures as thousands of blocks."""
    out = []
    for index in range(start, stop):
        item = fuzz.make_input(seed, index)
        out.append((item, fuzz.expected_answers(item.wire, max_frame)))
    return pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)


def _chunks(max_frame: int) -> Iterator[list[tuple[fuzz.FuzzInput, fuzz.Expectation]]]:
    """The inputs, chunk by chunk; the next chunk is generated while this one runs."""
    context = multiprocessing.get_context("spawn")  # threads are running here: no fork
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        bounds = [(s, min(s + CHUNK, INPUTS)) for s in range(0, INPUTS, CHUNK)]
        pending: list[concurrent.futures.Future[bytes] | None] = [
            pool.submit(_generate, SEED, a, b, max_frame) for a, b in bounds[:2]
        ]
        for number in range(len(bounds)):
            future = pending[number]
            assert future is not None
            pending[number] = None
            if number + 2 < len(bounds):
                a, b = bounds[number + 2]
                pending.append(pool.submit(_generate, SEED, a, b, max_frame))
            # not bound to a name here: the caller's `del` must free the chunk
            yield pickle.loads(future.result(timeout=300))
            del future


# ---- one connection ---------------------------------------------------------------------------


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.used = 0

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 2.0)


class _Run:
    def __init__(self, proxy: RunningProxy, tally: Tally) -> None:
        self.proxy = proxy
        self.tally = tally
        self.hung: list[tuple[int, int, int]] = []
        """(api key, version, correlation id) of the requests a hang left unanswered."""
        self.sent: set[int] = set()
        """Hashes of the complete frames clients sent in this chunk (see check_forwarded)."""

    async def chunk(self, items: list[tuple[fuzz.FuzzInput, fuzz.Expectation]]) -> None:
        queue: asyncio.Queue[tuple[fuzz.FuzzInput, fuzz.Expectation]] = asyncio.Queue()
        for pair in items:
            queue.put_nowait(pair)
        await asyncio.gather(*(self._worker(queue) for _ in range(CONCURRENCY)))

    async def _worker(self, queue: asyncio.Queue[tuple[fuzz.FuzzInput, fuzz.Expectation]]) -> None:
        conn: _Connection | None = None
        while not queue.empty() and len(self.tally.failures) < MAX_FAILURES:
            item, expected = queue.get_nowait()
            self.tally.inputs += 1
            self.tally.mutators.update(s.split("=")[0].split("[")[0] for s in item.steps)
            self.sent.update(hash(f) for f in expected.frames)
            if conn is None:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.proxy.host, self.proxy.port), HANG_TIMEOUT_S
                )
                conn = _Connection(reader, writer)
                self.tally.connections += 1
            keep = await self._one(conn, item, expected)
            conn.used += 1
            if not keep or conn.used >= MAX_REUSE:
                await conn.close()
                conn = None
        if conn is not None:
            await conn.close()

    async def _one(
        self, conn: _Connection, item: fuzz.FuzzInput, expected: fuzz.Expectation
    ) -> bool:
        """Send one input and check what comes back; True if the connection may carry more."""
        writer = conn.writer
        try:
            if item.byte_by_byte:
                for i in range(len(item.wire)):
                    writer.write(item.wire[i : i + 1])
                    await writer.drain()
            else:
                writer.write(item.wire)
                await writer.drain()
        except (ConnectionError, OSError, RuntimeError):  # uvloop: "the handler is closed"
            pass  # the proxy closed while we were still sending: its answers are still read
        buffer = bytearray()
        got = 0
        deadline = time.monotonic() + HANG_TIMEOUT_S
        closed = False
        while got < len(expected.answers):
            remaining = deadline - time.monotonic()
            try:
                data = await asyncio.wait_for(conn.reader.read(65536), max(remaining, 0.001))
            except TimeoutError:
                self.hung.extend(expected.answers[got:])
                self.tally.fail(
                    item,
                    f"hang: {got} of {len(expected.answers)} answers and no close after "
                    f"{HANG_TIMEOUT_S} s (expected {expected.answers}); the proxy's side: "
                    f"{self._proxy_side(conn)}",
                )
                return False
            except (ConnectionError, OSError):
                data = b""
            if not data:
                closed = True
                break
            buffer += data
            got = self._answers(item, expected, buffer, got)
            if got < 0:
                return False
        if closed:
            self.tally.proxy_closes += 1
            if buffer:
                self.tally.fail(item, f"the connection closed inside an answer: {buffer.hex()}")
            return False
        if not expected.ends_cleanly:
            self.tally.client_closes += 1
            return False
        return True

    def _proxy_side(self, conn: _Connection) -> str:
        """The proxy's state for this connection (why it neither answers nor closes)."""
        sockname = conn.writer.get_extra_info("sockname")
        peer = f"{sockname[0]}:{sockname[1]}" if sockname else "?"

        async def read() -> str:
            for client in list(self.proxy.server.listeners.connections._clients):
                if client.peer == peer:
                    upstream, held = client.upstream, client.held
                    return (
                        f"paused for {sorted(client._reading.paused_for)}, "
                        f"{len(client._slots)} slots, "
                        f"{'?' if upstream is None else len(upstream.awaiting)} awaiting upstream, "
                        f"held {None if held is None else len(held)}, upstream "
                        f"{'none' if upstream is None else upstream.transport}"
                    )
            return f"no client connection from {peer}"

        try:
            return self.proxy.call(read(), timeout=5)
        except Exception as exc:
            return f"unknown ({exc!r})"

    def _answers(
        self, item: fuzz.FuzzInput, expected: fuzz.Expectation, buffer: bytearray, got: int
    ) -> int:
        """Check the whole answer frames in `buffer` (removed from it); the new count, -1 on a
        failure."""
        while len(buffer) >= 4:
            (size,) = _SIZE.unpack_from(buffer)
            if size < 4 or size > 64 * 1024 * 1024:
                self.tally.fail(item, f"an answer with size prefix {size}")
                return -1
            if len(buffer) < 4 + size:
                break
            answer = bytes(buffer[4 : 4 + size])
            del buffer[: 4 + size]
            if got >= len(expected.answers):
                self.tally.fail(item, f"an answer nobody asked for: {answer[:64].hex()}")
                return -1
            api_key, api_version, cid = expected.answers[got]
            (answer_cid,) = _SIZE.unpack_from(answer)
            if answer_cid != cid:
                self.tally.fail(
                    item,
                    f"answer {got} has correlation id {answer_cid}, expected {cid} "
                    f"(answers expected: {expected.answers})",
                )
                return -1
            codec = fuzz.answer_version(api_key, api_version)
            if codec is not None:
                try:
                    decode_response(answer, *codec)
                except ProtocolError as exc:
                    self.tally.fail(
                        item,
                        f"the answer to api {api_key} v{api_version} does not decode: {exc}: "
                        f"{answer[:256].hex()}",
                    )
                    return -1
            got += 1
            self.tally.answers += 1
        return got


# ---- checks between chunks ----------------------------------------------------------------------


def _peer(conn: socket.socket) -> tuple[str, int] | None:
    try:
        host, port = conn.getpeername()[:2]
    except OSError:
        return None
    return (str(host), int(port))


def _stub_quiet(cluster: StubCluster, proxy: RunningProxy, timeout: float = 10.0) -> list[str]:
    """Wait until the stub holds no connection but the proxy's kept one for its own requests
    (`kvproxy.client.async_connections`), so every frame it will receive is recorded; the stacks of
    its
    connection threads still running after `timeout` (a stub stuck on a frame).

    Then forget the stub's finished connection threads: it keeps every thread it started, which
    would show as the test's own memory growth (the stub is not under test)."""
    kept = proxy.server.admin_connections.local_addresses

    def others() -> list[socket.socket]:
        own = kept()
        return [conn for conn in cluster._conns if _peer(conn) not in own]

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with cluster._lock:
            if not others():
                break
        time.sleep(0.02)
    stuck = []
    with cluster._lock:
        if others():
            frames = sys._current_frames()
            for thread in cluster._threads:
                if thread.is_alive() and thread.name.startswith("stub-conn"):
                    frame = frames.get(thread.ident or 0)
                    where = traceback.format_stack(frame, limit=3) if frame else []
                    stuck.append(f"{thread.name}: {''.join(where).strip()}")
        cluster._threads[:] = [t for t in cluster._threads if t.is_alive()]
    return stuck


def _check_upstream(cluster: StubCluster, run: _Run, tally: Tally) -> None:
    for node_id in cluster.node_ids:
        for frame, answer in cluster.frames(node_id):
            payload = bytes(frame)  # a large frame is a view of the stub's buffer
            tally.forwarded += 1
            problem = fuzz.check_forwarded(payload, answer is not None, run.sent, STUB_PRODUCE)
            if problem is not None:
                tally.fail(None, f"node {node_id} received {problem}: {payload[:512].hex()}")
            elif answer is None and payload[:2] != b"\x00\x00":
                tally.stub_closes_opaque += 1
    for api_key, version, cid in run.hung:  # where did the unanswered request go?
        seen = [
            answer is not None
            for node_id in cluster.node_ids
            for frame, answer in cluster.frames(node_id)
            if len(frame) >= 8 and struct.unpack_from(">hhi", frame) == (api_key, version, cid)
        ]
        where = (
            f"frames with that key, version and id reached the stub (answered: {seen})"
            if seen
            else "no frame with that key, version and id reached the stub"
        )
        tally.fail(None, f"a hang left ({api_key}, v{version}, id {cid}) unanswered; {where}")
    run.hung.clear()
    cluster.clear()
    run.sent.clear()


@dataclasses.dataclass(frozen=True)
class _Memory:
    blocks: int
    rss: int
    types: Counter[str]
    """Objects the collector tracks, by type name: says what grew when the blocks grew."""


async def _run_pending_callbacks() -> None:
    """Lets the proxy's loop run what it has queued (closing transports, finished tasks' done
    callbacks), which may still hold the last requests' values."""
    for _ in range(10):
        await asyncio.sleep(0)


def _memory(proxy: RunningProxy) -> _Memory:
    """Allocated blocks, resident bytes and tracked objects of this process, after the proxy's
    loop has run its queued callbacks and after a collection (the proxy runs in another thread:
    measured too early, the values of connections closed a moment ago are still referenced)."""
    proxy.call(_run_pending_callbacks())
    gc.collect()
    with open("/proc/self/statm") as statm:
        rss_pages = int(statm.read().split()[1])
    types = Counter(type(o).__qualname__ for o in gc.get_objects())
    return _Memory(sys.getallocatedblocks(), rss_pages * os.sysconf("SC_PAGE_SIZE"), types)


def _closes_by_reason(proxy: RunningProxy) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in proxy.server.metrics.closed.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                out[sample.labels["reason"]] = sample.value
    return out


def _still_serves(proxy: RunningProxy, cluster: StubCluster) -> None:
    """A normal ApiVersions and a valid Produce request through the proxy are answered."""
    cluster.clear()
    with RawKafkaClient(proxy.host, proxy.port) as client:
        answer = client.request(fuzz.api_versions_request(3, 77), timeout=10)
        versions = decode_response(answer, API_VERSIONS, 3)
        assert versions.header.correlation_id == 77
        assert int(versions.body.error_code) == 0
        batch = build_batch([(b"k", b"v", None, fuzz.TIMESTAMP_MS)])
        request = fuzz.produce_request(9, 78, [(fuzz.TOPIC, 0, batch)])
        answer = client.request(request, timeout=10)
        produced = decode_response(answer, PRODUCE, 9)
    assert produced.header.correlation_id == 78
    partition = produced.body.responses[0].partition_responses[0]
    assert int(partition.error_code) == 0, partition
    assert any(frame == request for frame, _ in cluster.frames(cluster.controller_id))


# ---- the test ------------------------------------------------------------------------------------


def _run_chunk(
    loop: asyncio.AbstractEventLoop,
    run: _Run,
    proxy: RunningProxy,
    cluster: StubCluster,
    chunk: list[tuple[fuzz.FuzzInput, fuzz.Expectation]],
) -> None:
    """Send a chunk, then check that nothing is left behind and what reached the upstream."""
    loop.run_until_complete(run.chunk(chunk))
    stats = proxy.wait_until_idle(timeout=15)
    if stats.client_connections or stats.upstream_connections or stats.pending_tasks:
        run.tally.fail(None, f"connections or tasks left after a chunk: {stats}")
    stuck = _stub_quiet(cluster, proxy)
    if stuck:
        run.tally.fail(None, f"the stub never finished with what it received: {stuck}")
    _check_upstream(cluster, run, run.tally)
    proxy.responses.clear()


def test_fuzz_proxy() -> None:
    """KVPROXY_FUZZ_INPUTS fuzzed inputs: no crash, no hang, well-formed answers or a close,
    nothing malformed upstream, nothing left behind, memory back to its baseline.

    Memory is measured on a replay: after the run, the first REPLAY inputs are sent again,
    twice. The proxy keeps state keyed by what clients send (per-topic metric labels, rule and
    topic-config caches, rejection counts), so the run itself may grow it; the replay sends
    nothing new, so after the first replay anything the second adds is a leak per connection
    or per request. Both figures are taken after a full collection, with the stub's
    recordings, the answer log and the frame hashes cleared. Allocated blocks count Python
    objects whatever their size: a leak of one object per request would add about REPLAY
    blocks (and one per connection about two thirds of that), so the replay may add at most
    REPLAY_BLOCK_TOLERANCE. RSS also sees large buffers and memory outside Python's allocator
    (cramjam's): REPLAY_RSS_TOLERANCE. The growth over the whole run is printed, not asserted.
    """
    started = time.monotonic()
    tally = Tally()
    crashes: list[str] = []
    kvproxy_log = logging.getLogger("kvproxy")
    level = kvproxy_log.level
    kvproxy_log.setLevel(logging.ERROR)  # thousands of "closing connection" warnings otherwise
    try:
        with (
            run_stub_cluster(node_ids=(1, 2, 3)) as cluster,
            run_proxy(cluster.bootstrap) as proxy,
        ):
            crashes = _watch_loop_errors(proxy)
            run = _Run(proxy, tally)
            loop = uvloop.new_event_loop()
            max_frame = proxy.config.limits.max_frame_bytes
            try:
                after_first: _Memory | None = None
                for chunk in _chunks(max_frame):
                    _run_chunk(loop, run, proxy, cluster, chunk)
                    del chunk
                    if after_first is None:
                        after_first = _memory(proxy)
                    if len(tally.failures) >= MAX_FAILURES:
                        break
                assert after_first is not None
                after_run = _memory(proxy)
                seconds = time.monotonic() - started
                summary = tally.summary(seconds)
                replay = pickle.loads(_generate(SEED, 0, min(REPLAY, INPUTS), max_frame))
                _run_chunk(loop, run, proxy, cluster, replay)
                before_replay = _memory(proxy)
                _run_chunk(loop, run, proxy, cluster, replay)
                after_replay = _memory(proxy)
                for _ in range(SETTLE_TRIES):
                    # A leak stays; values that a busy machine has not yet let go of do not.
                    if after_replay.blocks - before_replay.blocks < REPLAY_BLOCK_TOLERANCE:
                        break
                    time.sleep(1.0)
                    after_replay = _memory(proxy)
            finally:
                loop.close()
            closes = _closes_by_reason(proxy)
            crashed_policies = {k: v for k, v in proxy.server.routing.crash_counts().items() if v}
            if not tally.failures:
                _still_serves(proxy, cluster)
    finally:
        kvproxy_log.setLevel(level)
    blocks = after_replay.blocks - before_replay.blocks
    rss = after_replay.rss - before_replay.rss
    grown = (after_replay.types - before_replay.types).most_common(6)
    run_grown = (after_run.types - after_first.types).most_common(4)
    print()
    print(summary)
    print(
        f"fuzz: replay of {len(replay)} inputs: {blocks:+} blocks, {rss / 2**20:+.1f} MiB RSS; "
        f"whole run after its first chunk: {after_run.blocks - after_first.blocks:+} blocks "
        f"(most: {run_grown}), {(after_run.rss - after_first.rss) / 2**20:+.1f} MiB RSS"
    )
    print(
        f"fuzz: closes by reason {closes}; upstream closes on opaque frames "
        f"{tally.stub_closes_opaque}; steps {dict(sorted(tally.mutators.items()))}"
    )
    report = "\n".join(tally.failures[:MAX_FAILURES])
    assert not tally.failures, f"{len(tally.failures)} failures (seed {SEED}):\n{report}"
    assert not crashes, f"the proxy's event loop reported errors: {crashes[:10]}"
    assert not closes.get("internal_error"), closes
    assert not crashed_policies, f"policies crashed on fuzzed input: {crashed_policies}"
    assert tally.inputs == INPUTS + 2 * len(replay)
    assert blocks < REPLAY_BLOCK_TOLERANCE, (
        f"a replay of inputs already seen added {blocks} allocated blocks; grew: {grown}"
    )
    assert rss < REPLAY_RSS_TOLERANCE, f"a replay grew RSS by {rss / 2**20:.1f} MiB"


# ---- reproducers of what the fuzzer found ------------------------------------------------------


def _watch_loop_errors(proxy: RunningProxy) -> list[str]:
    errors: list[str] = []

    async def watch() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, context: errors.append(
                f"{context.get('message')}: {context.get('exception')!r}"
            )
        )

    proxy.call(watch())
    return errors


def _produce_frames(cluster: StubCluster) -> list[bytes]:
    return [frame for frame, _ in cluster.frames(cluster.controller_id) if frame[:2] == b"\0\0"]


def _with_record_count(batch: bytes, count: int) -> bytes:
    data = bytearray(batch)
    struct.pack_into(">i", data, 57, count)
    fuzz.fix_crc(data, fuzz.BatchSpan(0, 0, 0, len(data), 2))
    return bytes(data)


def test_negative_record_count_is_answered_not_a_transport_error() -> None:
    """Found by the fuzzer (seed 20261122, e.g. index 21: a batch_field mutation): a magic-2
    batch whose record count is negative (CRC valid) must be answered (Kafka: INVALID_RECORD,
    "Invalid reported count for record batch: -1 ..."), never closed on. The proxy counts the
    batch's records in a Prometheus counter, which raises ValueError on a negative increment
    inside the protocol callback: the event loop reports a fatal transport error and the client
    sees a close instead of an answer."""
    batch = _with_record_count(build_batch([(b"k", b"v", None, fuzz.TIMESTAMP_MS)]), -1)
    request = fuzz.produce_request(9, 5, [(fuzz.TOPIC, 0, batch)])
    with (
        run_stub_cluster(node_ids=(1,)) as cluster,
        run_proxy(cluster.bootstrap, topics=[{"match": "*", "compacted": False}]) as proxy,
    ):
        errors = _watch_loop_errors(proxy)
        with RawKafkaClient(proxy.host, proxy.port) as client:
            client.send_frame(request)
            closed = client.is_closed_by_peer(timeout=2)
        assert not errors, errors
        assert not closed, "the proxy closed the connection instead of answering"
        assert not _produce_frames(cluster), "a batch with a negative record count was forwarded"


def _legacy_wrapper(inner: bytes) -> bytes:
    """A magic-1 gzip wrapper message around the message set `inner`."""
    value = compress(Codec.GZIP, inner)
    body = (
        b"\x01\x01"  # magic 1, attributes: gzip
        + struct.pack(">q", fuzz.TIMESTAMP_MS)
        + struct.pack(">i", -1)  # null key
        + struct.pack(">i", len(value))
        + value
    )
    message = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(message)) + message


def test_inner_message_with_unknown_codec_bits_is_rejected_without_a_policy_crash() -> None:
    """Found by the fuzzer (compression_payload and batch_field mutations of magic 0/1 requests):
    a compressed wrapper whose inner message has compression bits 5-7 (no such codec) must be
    rejected like one with bits 1-4 ("Compressed outer record should not have an inner record
    with a compression attribute set", CORRUPT_MESSAGE for Produce v2). The batch_integrity
    policy words that message with `Codec(attributes & 7)` (`kvproxy/policies/builtin/broker.py`,
    `java_record`), which raises ValueError for 5-7: the policy crashes instead (the partition
    is still rejected, fail closed, and a policy crash is counted and logged with a traceback).
    """
    inner = bytearray(build_batch([(b"k", b"v", None, fuzz.TIMESTAMP_MS)], magic=1))
    inner[17] = 0x07  # the inner message's attributes: codec id 7
    fuzz.fix_crc(inner, fuzz.BatchSpan(0, 0, 0, len(inner), 1))
    request = fuzz.produce_request(2, 6, [(fuzz.TOPIC, 0, _legacy_wrapper(bytes(inner)))])
    with (
        run_stub_cluster(node_ids=(1,)) as cluster,
        run_proxy(cluster.bootstrap, topics=[{"match": "*", "compacted": False}]) as proxy,
    ):
        with RawKafkaClient(proxy.host, proxy.port) as client:
            answer = decode_response(client.request(request, timeout=10), PRODUCE, 2)
        partition = answer.body.responses[0].partition_responses[0]
        assert int(partition.error_code) == 2, partition
        crashed = {k: v for k, v in proxy.server.routing.crash_counts().items() if v}
        assert not crashed, f"policies crashed: {crashed}"
        assert not _produce_frames(cluster)


def test_a_client_leaving_during_a_topic_lookup_does_not_strand_the_others() -> None:
    """Found by the fuzzer (seed 20261122, e.g. indexes 1093, 1109, 2023: connections left
    "paused for topic-configs" with no task, neither answered nor closed).

    Three clients produce to the same topic, whose compaction the proxy must first learn with
    DescribeConfigs (here it takes a second: the first bootstrap server never answers). B's
    request starts the lookup; A's and C's wait on the same future
    (`kvproxy/proxy/lookups/topic_configs.py`, `TopicConfigCache.refresh`). A's connection then
    ends (here: the
    Fetch request A sent before its Produce makes the upstream close, so the proxy closes A), so
    A's task is cancelled; a task cancelled while it awaits a future cancels that future, so C's
    wait ends in CancelledError (C's connection stays paused for ever: no answer, no close, no
    task) and B's `future.set_result` raises InvalidStateError (B is closed as an internal
    error). Both B and C must be answered.
    """
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(16)  # accepts (the kernel does), never answers
    host, port = blackhole.getsockname()
    silent = f"{host}:{port}"
    batch = build_batch([(b"k", b"v", None, fuzz.TIMESTAMP_MS)])
    try:
        with (
            run_stub_cluster(node_ids=(1,)) as cluster,
            run_proxy([silent, cluster.bootstrap], upstream={"connect_timeout_ms": 1000}) as proxy,
        ):
            node_port = proxy.broker_port(1)  # upstream: stub node 1; lookups: the bootstrap list
            clients = {name: RawKafkaClient(proxy.host, node_port) for name in "BAC"}
            try:
                fetch = struct.pack(">hhih", 1, 4, 99, -1)  # the stub closes on a Fetch
                for cid, name in enumerate("BAC"):
                    request = fuzz.produce_request(9, 100 + cid, [("lookup-topic", 0, batch)])
                    if name == "A":
                        clients[name].send_raw(fuzz.frame_of(fetch) + fuzz.frame_of(request))
                    else:
                        clients[name].send_frame(request)
                    time.sleep(0.1)
                outcomes = {}
                for name in "BC":
                    try:
                        answer = clients[name].recv_frame(timeout=5)
                    except RawClientError as exc:
                        outcomes[name] = str(exc)
                    else:
                        outcomes[name] = f"answer {_SIZE.unpack_from(answer)[0]}"
                assert outcomes == {"B": "answer 100", "C": "answer 102"}, outcomes
            finally:
                for client in clients.values():
                    client.close()
    finally:
        blackhole.close()


BOMB_EXPANDED: Final = 256 * 1024 * 1024
BOMB_PEAK_LIMIT: Final = MAX_DECOMPRESSED_BYTES + 16 * 1024 * 1024


def test_a_decompression_bomb_is_refused_without_expanding_it() -> None:
    """Found by the fuzzer's compression_payload mutator (decompression bombs): a Produce
    request of about 9 KiB whose one zstd batch expands to 256 MiB. The proxy must refuse it (or
    read it without holding the expansion), not allocate what the payload claims: while the
    request is handled, the Python heap may not peak more than the request's decoding budget
    (`limits.decode_bytes_per_request`, 64 MiB here) plus 16 MiB above where it was, and the
    client is answered MESSAGE_TOO_LARGE. Without a bound a 9 KiB request cost about 512 MiB,
    and a 100 MiB request (the frame limit) could claim terabytes.
    """
    batch = fuzz.bomb_batch(Codec.ZSTD, BOMB_EXPANDED)
    request = fuzz.produce_request(9, 9, [(fuzz.TOPIC, 0, batch)])
    assert len(request) < 16 * 1024
    with (
        run_stub_cluster(node_ids=(1,)) as cluster,
        run_proxy(
            cluster.bootstrap,
            topics=[{"match": "*", "compacted": False}],
            limits={"decode_bytes_per_request": BOMB_PEAK_LIMIT - 16 * 1024 * 1024},
        ) as proxy,
    ):
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            with RawKafkaClient(proxy.host, proxy.port) as client:
                answer = client.request(request, timeout=30)
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
    partition = decode_response(answer, PRODUCE, 9).body.responses[0].partition_responses[0]
    assert int(partition.error_code) == 10, partition  # MESSAGE_TOO_LARGE
    assert "limits.decode_bytes_per_request" in (partition.error_message or "")
    assert peak < BOMB_PEAK_LIMIT, (
        f"a {len(request)}-byte request made the proxy allocate {peak / 2**20:.0f} MiB"
    )


def test_an_answer_is_not_taken_for_an_earlier_acks0_request_with_the_same_id() -> None:
    """Found by the fuzzer (seed 20261122, indexes 37947, 54016, 97882 of the 100,000-input run:
    requests the stub answered and the proxy never passed on).

    A client sends an acks=0 Produce request with correlation id 7, then an ApiVersions request
    that also carries id 7 (ids need not be unique on the wire; they also wrap around). The
    broker sends no answer to acks=0 requests, so the proxy remembers the acks=0 one as "silent"
    in case a broker answers it anyway (Tansu does). When the ApiVersions answer arrives, id 7
    matches the remembered silent request (`UpstreamConnection`), and the
    answer is dropped as that request's: the client never gets it (it waits for ever, or until
    a timeout of the proxy closes the connection). It must get its answer.
    """
    batch = build_batch([(b"k", b"v", None, fuzz.TIMESTAMP_MS)])
    acks0 = fuzz.produce_request(9, 7, [(fuzz.TOPIC, 0, batch)], acks=0)
    with (
        run_stub_cluster(node_ids=(1,)) as cluster,
        run_proxy(cluster.bootstrap, topics=[{"match": "*", "compacted": False}]) as proxy,
        RawKafkaClient(proxy.host, proxy.port) as client,
    ):
        client.send_frame(acks0)
        try:
            answer = client.request(fuzz.api_versions_request(3, 7), timeout=5)
        except RawClientError as exc:
            answered = [a is not None for f, a in cluster.frames(1) if f[:2] == b"\0\x12"]
            raise AssertionError(f"no answer ({exc}); the stub answered: {answered}") from None
        assert _SIZE.unpack_from(answer)[0] == 7


def test_a_client_sending_only_acks0_requests_holds_bounded_memory() -> None:
    """A broker never answers acks=0 requests (the stub, like Kafka; Tansu does answer them), so
    the acks=0 requests the proxy remembers in case it does are never matched by an answer. A
    client that sends nothing else must not make that list grow without end: past
    `MAX_SILENT_SLOTS` the oldest is forgotten, and the connection goes on serving."""
    batch = build_batch([(b"k", b"v", None, fuzz.TIMESTAMP_MS)])
    sent = MAX_SILENT_SLOTS + 500
    frames = b"".join(
        _SIZE.pack(len(f)) + f
        for f in (
            fuzz.produce_request(9, 100_000 + n, [(fuzz.TOPIC, 0, batch)], acks=0)
            for n in range(sent)
        )
    )
    with (
        run_stub_cluster(node_ids=(1,)) as cluster,
        run_proxy(cluster.bootstrap, topics=[{"match": "*", "compacted": False}]) as proxy,
        RawKafkaClient(proxy.host, proxy.port) as client,
    ):
        client.send_raw(frames)
        deadline = time.monotonic() + 60
        while len(cluster.requests(1, PRODUCE)) < sent:
            assert time.monotonic() < deadline, len(cluster.requests(1, PRODUCE))
            time.sleep(0.05)
        (connection,) = proxy.server.listeners.connections._clients
        assert len(connection.upstream.awaiting) == MAX_SILENT_SLOTS
        answer = client.request(fuzz.api_versions_request(3, 7), timeout=5)
        assert _SIZE.unpack_from(answer)[0] == 7  # still served, in order
