"""`LookupSlots`: a connection holds at most its share of the registry lookups, and freed slots
go to the connections waiting in turn."""

from __future__ import annotations

import asyncio

from kvproxy.registry.lookup_slots import LookupSlots


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_owner_holds_at_most_its_share_and_others_still_get_slots() -> None:
    slots = LookupSlots(total=4, per_owner=2)
    hostile = [asyncio.create_task(slots.acquire("b")) for _ in range(10)]
    await _settle()
    assert slots.held_by("b") == 2
    innocent = asyncio.create_task(slots.acquire("a"))
    await _settle()
    assert innocent.done()  # a slot while b's eight others wait
    assert sum(task.done() for task in hostile) == 2
    for task in hostile:
        task.cancel()
    await _settle()
    slots.release("b")
    slots.release("b")
    slots.release("a")
    assert slots.free == 4


async def test_freed_slots_go_to_waiting_owners_in_turn() -> None:
    slots = LookupSlots(total=1, per_owner=1)
    await slots.acquire("x")
    order: list[str] = []

    async def take(owner: str) -> None:
        await slots.acquire(owner)
        order.append(owner)

    tasks = [asyncio.create_task(take(owner)) for owner in ("b", "b", "b", "a", "c")]
    await _settle()
    for _ in range(5):
        held = order[-1] if order else "x"
        slots.release(held)
        await _settle()
    assert order == ["b", "a", "c", "b", "b"]
    await asyncio.gather(*tasks)


async def test_a_waiter_cancelled_holds_nothing() -> None:
    slots = LookupSlots(total=1, per_owner=1)
    await slots.acquire(None)
    waiting = asyncio.create_task(slots.acquire("a"))
    await _settle()
    waiting.cancel()
    await _settle()
    slots.release(None)
    assert slots.free == 1 and slots.held_by("a") == 0


async def test_a_slot_freed_before_a_cancelled_waiter_runs_goes_to_the_next_waiter() -> None:
    # A lookup cancelled while it waits has its future cancelled at once, but its own
    # `except CancelledError` runs only on the loop's next turn. A slot released in between
    # (another lookup ending, as behind a tarpitting registry) must pass over the cancelled
    # future: granting it raised InvalidStateError out of `release`, ending the releasing
    # lookup with that error ("Task exception was never retrieved") and losing the slot.
    slots = LookupSlots(total=1, per_owner=1)
    await slots.acquire("a")
    cancelled = asyncio.create_task(slots.acquire("b"))
    waiting = asyncio.create_task(slots.acquire("c"))
    await _settle()
    cancelled.cancel()  # the future is cancelled now; the task's handler has not run yet
    slots.release("a")  # raised InvalidStateError before
    await _settle()
    assert cancelled.cancelled()
    assert waiting.done() and waiting.exception() is None
    assert slots.held_by("b") == 0 and slots.held_by("c") == 1
    slots.release("c")
    assert slots.free == 1
