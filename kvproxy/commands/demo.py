"""`kvproxy demo`: kvproxy in front of the embedded broker, driven by real Kafka clients.

It starts the embedded development broker and kvproxy in front of it, produces and consumes
records through the proxy with aiokafka, and shows which broker addresses the client was given
(only the proxy's). Then it sends what the broker would store without a word — a null key to a
compacted topic, a batch whose CRC no longer matches its bytes, a payment in a currency a custom
policy refuses, invoices without a valid schema id (checked against a stand-in schema registry the
demo serves) — and prints the answers a client receives from kvproxy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import logging
import shlex
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.types import TopicName
from kio.static.primitive import Records, i16, i32, i32Timedelta

from kvproxy.commands.demo_registry import DemoSchema, serve_demo_registry
from kvproxy.protocol.error_codes import error_name
from kvproxy.protocol.framing import FrameDecoder, frame
from kvproxy.protocol.messages import PRODUCE, decode_response, encode_request, make_request
from kvproxy.protocol.records import build_batch, read_batch
from kvproxy.proxy.config.proxy_config import ProxyConfig, parse_config
from kvproxy.proxy.ops.logs import RejectionEvent
from kvproxy.proxy.serve.app import running_proxy
from kvproxy.proxy.serve.server import ProxyServer

DEMO_TOPIC = "kvproxy-demo"
COMPACTED_TOPIC = "customers"
PAYMENTS_TOPIC = "payments"
INVOICES_TOPIC = "invoices"
INVOICE_SCHEMA = DemoSchema(
    schema_id=1,
    subject=f"{INVOICES_TOPIC}-value",
    schema='{"type": "record", "name": "Invoice", "fields": [{"name": "amount", "type": "long"}]}',
)
TANSU_NODE_ID = 111
DEMO_PORT = 9192
"""The demo's bootstrap port unless `--port` says otherwise: `kvproxy serve`'s default, the same
at every run so that clients keep finding it; the broker listener is the next port."""
REPO_ROOT = Path(__file__).resolve().parents[1]
"""Where `examples/` lives when kvproxy runs from its source tree (as `make demo` does)."""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="run kvproxy in front of the embedded broker and send records through it"
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="leave kvproxy and the broker running until Ctrl-C (to point your clients at it)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEMO_PORT,
        help=f"bootstrap port (default {DEMO_PORT}; the broker listener is the next one); when "
        "either is taken, free ports are used instead and the demo says so",
    )
    parser.set_defaults(func=run)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _taken(port: int) -> bool:
    """Whether something listens on (or holds) 127.0.0.1:`port`; a closed connection's TIME_WAIT
    from an earlier run does not count, as the proxy binds with SO_REUSEADDR too."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def demo_ports(port: int) -> tuple[int, int, str | None]:
    """The bootstrap and broker ports, `port` and the next one when both are free; otherwise
    free ones (the bootstrap's chosen when it binds: 0) and the sentence that says why."""
    taken = [p for p in (port, port + 1) if _taken(p)]
    if not taken:
        return port, port + 1, None
    ports = " and ".join(str(p) for p in taken)
    return 0, _free_port(), f"port {ports} {'is' if len(taken) == 1 else 'are'} taken"


def demo_config(registry_url: str, bootstrap_port: int, broker_port: int) -> ProxyConfig:
    return parse_config(
        {
            "listen": {
                "host": "127.0.0.1",
                "port": bootstrap_port,
                "broker_port_base": broker_port,
                "max_brokers": 1,  # node N -> broker_port + N mod 1: Tansu's one node
            },
            "upstream": {"embedded": True},
            "metrics": {"port": 0},
            "topics": [
                {
                    "match": PAYMENTS_TOPIC,
                    "policies": [
                        "batch_integrity",
                        "crc",
                        {
                            "custom": {
                                "class": "examples.policies:CurrencyPolicy",
                                "config": {"allowed": ["EUR", "USD"]},
                            }
                        },
                    ],
                },
                {
                    "match": INVOICES_TOPIC,
                    "policies": [{"schema": {"value": "required"}}],  # with the default checks
                },
            ],
            "schema_registry": {"url": registry_url},
        },
        "demo",
    )


async def _clients(bootstrap: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: PLC0415

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        print(f"\naiokafka producer -> kvproxy {bootstrap} -> broker:")
        for i in range(3):
            key, value = b"order-%d" % i, b'{"amount": %d}' % (i * 10)
            metadata = await producer.send_and_wait(DEMO_TOPIC, value, key=key, partition=0)
            print(f"  sent {key.decode()} = {value.decode()}  -> offset {metadata.offset}")
        brokers = sorted((b.nodeId, b.host, b.port) for b in producer.client.cluster.brokers())
        print(f"  brokers the client was told about: {brokers} (proxy listeners only)")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partition = TopicPartition(DEMO_TOPIC, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        records = (await consumer.getmany(partition, timeout_ms=5000)).get(partition, [])
        print("aiokafka consumer read back through kvproxy:")
        for record in records:
            print(f"  offset {record.offset}: {record.key.decode()} = {record.value.decode()}")
    finally:
        await consumer.stop()


async def _raw_produce(host: str, port: int, topic: str, batch: bytes) -> str:
    """Produce v9 with kvproxy's own codec; the answer as a client library would report it."""
    body = ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=5)),
        topic_data=(
            TopicProduceData(
                name=TopicName(topic),
                partition_data=(PartitionProduceData(index=i32(0), records=Records(batch)),),
            ),
        ),
    )
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(frame(encode_request(make_request(PRODUCE, 9, 1, "kvproxy-demo", body))))
        decoder = FrameDecoder()
        while (payload := decoder.next_frame()) is None:
            chunk = await reader.read(65536)
            if not chunk:
                raise ConnectionError("connection closed")
            decoder.receive_data(chunk)
    finally:
        writer.close()
    answer = decode_response(payload, PRODUCE, 9).body.responses[0].partition_responses[0]
    code = int(answer.error_code)
    if code == 0:
        return f"NONE: stored at offset {answer.base_offset}"
    lines = [f"{error_name(code)} ({code}): {answer.error_message}"]
    lines.extend(
        f"record {e.batch_index}: {e.batch_index_error_message}" for e in answer.record_errors
    )
    return "\n      ".join(lines)


def _verdict(batch_bytes: bytes) -> str:
    batch, _ = read_batch(batch_bytes)
    if batch.crc_valid():
        return f"CRC32C ok, {batch.record_count} records"
    return (
        f"CORRUPT_MESSAGE: stored crc {batch.crc:#010x} but the bytes give "
        f"{batch.computed_crc():#010x}"
    )


async def _create_topics(bootstrap: str) -> None:
    """The compacted topic, and the payments topic (the metrics name only topics that exist)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: PLC0415

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(COMPACTED_TOPIC, 1, 1, topic_configs={"cleanup.policy": "compact"}),
                NewTopic(PAYMENTS_TOPIC, 1, 1),
                NewTopic(INVOICES_TOPIC, 1, 1),
            ]
        )
    finally:
        await admin.close()


def _with_schema_id(schema_id: int, payload: bytes) -> bytes:
    """A value in Confluent's wire format: magic byte 0, the id in 4 bytes, the payload."""
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


async def _demo(keep_running: bool, port: int) -> None:
    with serve_demo_registry(INVOICE_SCHEMA) as registry_url:
        await _demo_with_registry(keep_running, registry_url, port)


async def _demo_with_registry(keep_running: bool, registry_url: str, port: int) -> None:
    bootstrap_port, broker_port, taken = demo_ports(port)
    config = demo_config(registry_url, bootstrap_port, broker_port)
    async with running_proxy(config, REPO_ROOT) as server:
        _print_addresses(server)
        if taken is not None:
            print(
                f"  ({taken}, by another program or demo: kvproxy listens on free ports instead; "
                "--port chooses others)"
            )
        host, port = server.listeners.brokers.public_host, server.listeners.bootstrap_port
        await _clients(f"{host}:{port}")
        await _create_topics(f"{host}:{port}")
        good = build_batch([(b"k%d" % i, b"v%d" % i, (), None) for i in range(3)])
        corrupt = bytearray(good)
        corrupt[-1] ^= 0xFF  # one flipped bit in the last record's value
        cases = [
            ("a good batch", DEMO_TOPIC, good),
            ("the same batch, one bit flipped", DEMO_TOPIC, bytes(corrupt)),
            (
                f"a null key to {COMPACTED_TOPIC!r} (cleanup.policy=compact, learned from the "
                "cluster)",
                COMPACTED_TOPIC,
                build_batch([(b"c-1", b"alice", (), None), (None, b"bob", (), None)]),
            ),
            (
                f"a payment in GBP to {PAYMENTS_TOPIC!r} (custom CurrencyPolicy: EUR, USD)",
                PAYMENTS_TOPIC,
                build_batch([(b"p-1", b'{"amount": 5, "currency": "GBP"}', (), None)]),
            ),
            (
                f"three invoices to {INVOICES_TOPIC!r} (schema policy): schema id "
                f"{INVOICE_SCHEMA.schema_id}, no schema id, schema id 99 (unknown)",
                INVOICES_TOPIC,
                build_batch(
                    [
                        (b"i-1", _with_schema_id(INVOICE_SCHEMA.schema_id, b"\x0a"), (), None),
                        (b"i-2", b'{"amount": 5}', (), None),
                        (b"i-3", _with_schema_id(99, b"\x0a"), (), None),
                    ]
                ),
            ),
        ]
        print(
            f"\nschema registry: {registry_url}, a stand-in the demo serves (not a real schema "
            f"registry): it holds schema {INVOICE_SCHEMA.schema_id} under "
            f"{INVOICE_SCHEMA.subject!r} and answers the proxy's lookups"
        )
        print("\nWhat the broker would store without a word, through kvproxy (Produce v9):")
        for label, topic, batch in cases:
            print(f"  {label}")
            print(f"    -> {await _raw_produce(host, port, topic, batch)}")
        print(f"\n  kvproxy's own decoder on the flipped batch: {_verdict(bytes(corrupt))}")
        await _print_metrics(server)
        if keep_running:
            server.sink.rejection_listeners.append(_print_rejection)
            print(
                f"\nkvproxy stays up on {host}:{port}; each rejection is printed as it happens; "
                "Ctrl-C or SIGTERM stops"
            )
            _print_how_to_connect(f"{host}:{port}")
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()


def _print_how_to_connect(bootstrap: str) -> None:
    """Commands to paste: read the demo's records, and send what the proxy refuses."""
    python = (
        "from confluent_kafka import Producer; "
        f"p = Producer({{'bootstrap.servers': '{bootstrap}'}}); "
        f"p.produce({COMPACTED_TOPIC!r}, b'bob', on_delivery=lambda err, msg: print(err or "
        "f'stored at offset {msg.offset()}')); p.flush()"
    )
    print(
        f"\nPoint your clients at the bootstrap address {bootstrap}, for instance:\n"
        f"  kcat -b {bootstrap} -C -t {DEMO_TOPIC} -e\n"
        f"  echo bob | kcat -b {bootstrap} -P -t {COMPACTED_TOPIC}   # no key: refused\n"
        f'  {shlex.quote(sys.executable)} -c "{python}"',
        flush=True,
    )


def _print_rejection(event: RejectionEvent) -> None:
    """One line per rejection on stdout (a terminal, or a pipe that keeps up: a line is short,
    and the demo serves your own clients only)."""
    verb = "rejected" if event.enforced else "would reject (warn mode)"
    client = f"client {event.client_id!r} at {event.client_address}"
    with contextlib.suppress(BrokenPipeError):  # `| head`: the demo goes on serving
        print(
            f"{verb}: {event.topic}-{event.partition} by {event.policy}: "
            f"{error_name(event.code)} ({event.code}): {event.message} [{client}]",
            flush=True,
        )


async def _print_metrics(server: ProxyServer) -> None:
    """The counters an operator scrapes from /metrics after the exchanges above."""
    wanted = ("kvproxy_policy_rejections_total", "kvproxy_produce_records_total{")
    text = (await server.metrics.render()).decode()
    lines = [line for line in text.splitlines() if line.startswith(wanted)]
    where = f" (http://127.0.0.1:{server.metrics_port}/metrics)" if server.metrics_port else ""
    print(f"\nmetrics{where}:")
    for line in lines:
        print(f"  {line}")


def _print_addresses(server: ProxyServer) -> None:
    listeners, brokers = server.listeners, server.listeners.brokers
    upstream = ", ".join(f"{h}:{p}" for h, p in brokers.bootstrap_servers)
    print(f"embedded broker (Tansu) on {upstream}, node id {TANSU_NODE_ID}")
    print(f"kvproxy bootstrap listener on {brokers.public_host}:{listeners.bootstrap_port}")
    print(f"kvproxy listener for node {TANSU_NODE_ID} on port {brokers.port_for(TANSU_NODE_ID)}")


async def _until_signal(keep_running: bool, port: int) -> None:
    """The demo, cancelled by SIGTERM (as Ctrl-C cancels it), so that whatever ends it, the
    proxy and the embedded broker stop on the way out."""
    loop = asyncio.get_running_loop()
    demo = asyncio.current_task()
    assert demo is not None
    for sig in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, demo.cancel)
    await _demo(keep_running, port)


def run(args: argparse.Namespace) -> int:
    logging.getLogger("kvproxy").setLevel(logging.ERROR)  # the demo prints what matters itself
    with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
        asyncio.run(_until_signal(args.keep_running, args.port))
    return 0
