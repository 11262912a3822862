"""Where the fields of a record batch (magic 2) and of a message (magic 0/1) sit in their bytes."""

from __future__ import annotations

import struct

# Offset + length prefix shared by every magic: the "log overhead".
LOG_OVERHEAD = 12
PREFIX = struct.Struct(">qi")
MAGIC_POS = 16

# Magic 2 header: base offset, length, leader epoch, magic, crc, attributes, last offset delta,
# first timestamp, max timestamp, producer id, producer epoch, base sequence, record count.
V2_HEADER = struct.Struct(">qiibIhiqqqhii")
V2_HEADER_SIZE = V2_HEADER.size  # 61
V2_ATTRIBUTES_POS = 21
V2_CRC_POS = 17

# Legacy message: offset, length, crc, magic, attributes [, timestamp (magic 1)].
V0_HEADER = struct.Struct(">qiIbb")
V1_HEADER = struct.Struct(">qiIbbq")
INT32 = struct.Struct(">i")

# Smallest value the length field can hold for each magic (everything after the length field).
MIN_LENGTH_BY_MAGIC: dict[int, int] = {0: 14, 1: 22, 2: V2_HEADER_SIZE - LOG_OVERHEAD}
MIN_LENGTH = MIN_LENGTH_BY_MAGIC[0]

TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
