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
