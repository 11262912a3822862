from kvproxy.protocol.fast_accept import Accepted, FormOf

def accept_produce(
    frame: bytes | bytearray | memoryview,
    form_of: FormOf,
    now_ms: int,
    max_partitions: int,
    max_records: int,
    max_request_records: int,
    /,
) -> Accepted | None: ...
def crc32c(data: bytes | bytearray | memoryview, /) -> int: ...
def answer_plain(frame: bytes | bytearray | memoryview, version: int, /) -> bool: ...
