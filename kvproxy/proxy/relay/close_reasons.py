"""Why a client connection is closed or stops reading.

A close reason is the `reason` label of `kvproxy_connections_closed_total`, so each value is
exactly the label the metric has always carried. A pause reason names one of the independent
holds on reading: reading resumes once none is left.
"""

from __future__ import annotations

from enum import StrEnum


class CloseReason(StrEnum):
    """The label a closed connection is counted under."""

    MALFORMED = "malformed"
    ACKS0_REJECTION = "acks0_rejection"
    UPSTREAM_ERROR = "upstream_error"
    UPSTREAM_CLOSED = "upstream_closed"
    NO_UPSTREAM = "no_upstream"
    OUT_OF_FILE_DESCRIPTORS = "out_of_file_descriptors"
    SLOW_REQUEST = "slow_request"
    FRAME_RECEIVE_TIMEOUT = "frame_receive_timeout"
    IDLE = "idle"
    INTERNAL_ERROR = "internal_error"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    TOO_MANY_HANDSHAKES = "too_many_handshakes"


class PauseReason(StrEnum):
    """What holds a client connection's reading."""

    CONNECTING = "connecting"
    """Its upstream connection is not open yet."""
    MEMORY = "memory"
    """A large frame waits for receive memory (`limits.receive_buffer_bytes`)."""
    UPSTREAM_FULL = "upstream-full"
    """The broker side's write buffer is full."""
    IN_FLIGHT = "in-flight"
    """`limits.max_in_flight_requests` requests await their answers."""
    PRODUCE = "produce"
    """A Produce request is being decided off the loop; later requests must wait for it."""
