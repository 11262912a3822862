"""The clock of a frame holding receive memory: it runs from the frame's reservation, whatever
bytes arrive meanwhile; it starts again for the next frame; it stops while the proxy itself holds
reading, not while the client's own doing does; and a frame that reserved nothing has none."""

from __future__ import annotations

import struct

from kvproxy.protocol.budget import MemoryBudget
from kvproxy.protocol.framing import FrameDecoder
from kvproxy.proxy.relay.close_reasons import PauseReason
from kvproxy.proxy.relay.receive_memory import FrameClock

MiB = 1024 * 1024


def _decoder() -> tuple[FrameDecoder, MemoryBudget]:
    budget = MemoryBudget(4 * MiB, "limits.receive_buffer_bytes")
    return FrameDecoder(MiB, None, budget), budget


def test_a_frame_trickled_byte_by_byte_is_overdue_at_its_limit() -> None:
    decoder, budget = _decoder()
    clock = FrameClock(500)
    decoder.receive_data(struct.pack(">i", 200_000) + b"x")
    assert decoder.next_frame() is None
    assert budget.in_use == 200_000
    overdue = []
    for tick in range(8):  # a byte every 100 ms: always recent progress
        decoder.receive_data(b"x")
        overdue.append(clock.overdue(tick * 0.1, decoder))
    assert overdue == [False] * 5 + [True] * 3
    assert round(clock.spent, 3) == 0.7


def test_the_clock_starts_again_for_each_frame() -> None:
    """Large frames back to back, each completing within the limit: none is overdue, however
    long the connection keeps sending them."""
    decoder, budget = _decoder()
    clock = FrameClock(500)
    body = b"y" * 100_000
    for index in range(20):
        decoder.receive_data(struct.pack(">i", len(body)) + body[:10])
        assert decoder.next_frame() is None
        assert not clock.overdue(index * 0.4, decoder)
        decoder.receive_data(body[10:] + struct.pack(">i", len(body)) + body[:10])
        assert decoder.next_frame() == body  # the next one has reserved in its turn
        assert decoder.next_frame() is None
        assert not clock.overdue(index * 0.4 + 0.3, decoder)
        decoder.receive_data(body[10:])
        assert decoder.next_frame() == body
    assert decoder.reserved_frame is None
    assert budget.in_use == 0
    assert decoder.reservations == 40


def test_time_the_proxy_holds_reading_does_not_count() -> None:
    decoder, _ = _decoder()
    clock = FrameClock(500)
    decoder.receive_data(struct.pack(">i", 200_000) + b"x")
    decoder.next_frame()
    assert not clock.overdue(0.0, decoder)
    assert not clock.overdue(0.3, decoder)
    assert not clock.overdue(60.0, decoder, {PauseReason.PRODUCE})  # a request decided
    assert not clock.overdue(90.0, decoder, {PauseReason.CONNECTING, PauseReason.IN_FLIGHT})
    assert not clock.overdue(90.1, decoder)
    assert clock.overdue(90.3, decoder)


def test_answers_the_client_does_not_read_do_not_stop_the_clock() -> None:
    """A client that stops reading its answers fills its requests in flight, and reading stops:
    its own doing, so its reserved frame's clock runs on."""
    decoder, _ = _decoder()
    clock = FrameClock(500)
    decoder.receive_data(struct.pack(">i", 200_000) + b"x")
    decoder.next_frame()
    assert not clock.overdue(0.0, decoder)
    assert not clock.overdue(0.3, decoder, {PauseReason.IN_FLIGHT})
    assert clock.overdue(0.6, decoder, {PauseReason.IN_FLIGHT, PauseReason.UPSTREAM_FULL})


def test_a_frame_that_reserved_nothing_has_no_clock() -> None:
    decoder, budget = _decoder()
    clock = FrameClock(500)
    decoder.receive_data(struct.pack(">i", 1000) + b"x")  # small: the shared read buffer
    assert decoder.next_frame() is None
    assert budget.in_use == 0
    assert not any(clock.overdue(t * 1.0, decoder) for t in range(10))
