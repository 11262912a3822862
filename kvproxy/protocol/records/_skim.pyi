from kvproxy.protocol.records.record import RecordScan

def skim_v2(
    plain: bytes | bytearray | memoryview,
    count: int,
    first_timestamp: int,
    max_timestamp: int,
    log_append_time: bool,
    /,
) -> RecordScan | None: ...
def values_v2(
    plain: bytes | bytearray | memoryview,
    count: int,
    first_timestamp: int,
    max_timestamp: int,
    log_append_time: bool,
    /,
) -> list[bytes | None] | None: ...
