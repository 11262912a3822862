"""Record batches (magic 2) and messages (magic 0/1): lazy views, readers and a writer.

A `RecordBatch` is a view over bytes the caller already holds: header fields come straight from
the buffer with `struct`, nothing is decompressed or parsed until `records()` is asked for. Record
parsing for magic 2 is aiokafka's C-accelerated reader, fed the (decompressed) batch; the legacy
formats are small enough to parse here, which also gives us what aiokafka hides (inner attributes,
inner CRCs, Kafka 0.8's lz4 framing). Library types and exceptions never leave this package: every
failure is a `kvproxy.protocol.errors.DecodeError`.
"""

from kvproxy.protocol.records.batch import RecordBatch
from kvproxy.protocol.records.readers import iter_batches, read_batch, read_batches
from kvproxy.protocol.records.record import Header, Record, RecordInput, RecordScan
from kvproxy.protocol.records.writer import build_batch

__all__ = [
    "Header",
    "Record",
    "RecordBatch",
    "RecordInput",
    "RecordScan",
    "build_batch",
    "iter_batches",
    "read_batch",
    "read_batches",
]
