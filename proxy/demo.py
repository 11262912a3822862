"""`kvproxy demo`: the embedded broker, and what kvproxy's decoder sees that the broker does not.

It starts the embedded broker, asks it what it supports, and produces two record batches with the
project's own codec: a good one and one whose stored CRC no longer matches its bytes. The
development broker accepts both; kvproxy's decoder tells them apart, which is the check the proxy
puts in front of the broker.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import signal
import socket
from typing import Any

from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.types import TopicName
from kio.static.primitive import Records, i16, i32, i32Timedelta

from protocol.error_codes import error_name
from protocol.framing import FrameDecoder, frame
from protocol.messages import (
    API_NAMES,
    API_VERSIONS,
    PRODUCE,
    Request,
    Response,
    decode_response,
    encode_request,
    make_request,
)
from protocol.records import build_batch, read_batch
from proxy.embedded import EmbeddedBroker, run_embedded_broker

DEMO_TOPIC = "kvproxy-demo"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="start the embedded broker and show what kvproxy checks that it does not"
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the embedded broker running until Ctrl-C (to point clients at it)",
    )
    parser.set_defaults(func=run)


class _Connection:
    """A blocking Kafka connection, enough for a demo: one request, one response."""

    def __init__(self, broker: EmbeddedBroker) -> None:
        self._sock = socket.create_connection((broker.host, broker.port), timeout=10)
        self._decoder = FrameDecoder()
        self._correlation_id = 0

    def call(self, api_key: int, version: int, body: object) -> Response:
        self._correlation_id += 1
        request: Request = make_request(
            api_key, version, self._correlation_id, "kvproxy-demo", body
        )
        self._sock.sendall(frame(encode_request(request)))
        while (payload := self._decoder.next_frame()) is None:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            self._decoder.receive_data(chunk)
        return decode_response(payload, api_key, version)

    def close(self) -> None:
        self._sock.close()


def _produce(connection: _Connection, batch: bytes) -> str:
    body = ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=5)),
        topic_data=(
            TopicProduceData(
                name=TopicName(DEMO_TOPIC),
                partition_data=(PartitionProduceData(index=i32(0), records=Records(batch)),),
            ),
        ),
    )
    answer = connection.call(PRODUCE, 9, body).body.responses[0].partition_responses[0]
    return f"{error_name(int(answer.error_code))} (base offset {answer.base_offset})"


def _verdict(batch_bytes: bytes) -> str:
    batch, _ = read_batch(batch_bytes)
    if batch.crc_valid():
        return f"CRC32C ok, {batch.record_count} records"
    return (
        f"CORRUPT_MESSAGE: stored crc {batch.crc:#010x} but the bytes give "
        f"{batch.computed_crc():#010x}"
    )


def run(args: argparse.Namespace) -> int:
    with run_embedded_broker() as broker:
        print(f"embedded broker (Tansu) listening on {broker.bootstrap}")
        connection = _Connection(broker)
        try:
            versions = connection.call(
                API_VERSIONS,
                3,
                ApiVersionsRequest(client_software_name="kvproxy", client_software_version="0"),
            ).body
            print(f"it supports {len(versions.api_keys)} APIs; the ones kvproxy decodes:")
            for api in sorted(versions.api_keys, key=lambda a: a.api_key):
                if api.api_key in API_NAMES:
                    name = API_NAMES[api.api_key]
                    print(f"  {name:<16} v{api.min_version}-v{api.max_version}")
            good = build_batch(
                [(b"order-%d" % i, b'{"amount": %d}' % (i * 10), (), None) for i in range(3)]
            )
            corrupt = bytearray(good)
            corrupt[-1] ^= 0xFF  # one flipped bit in the last record's value
            print(f"\nproducing to {DEMO_TOPIC!r} with Produce v9:")
            for label, batch in (("good batch", good), ("corrupted batch", bytes(corrupt))):
                print(f"  {label:<16} broker answered {_produce(connection, batch)}")
                print(f"  {'':<16} kvproxy decoder: {_verdict(batch)}")
        finally:
            connection.close()
        if args.keep_running:
            print(f"\nbroker stays up on {broker.bootstrap}; Ctrl-C to stop")
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    return 0
