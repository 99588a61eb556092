"""The inbound budget's rules (``openpi/gate.py``), on its own event loop: who may read next, and when."""

from __future__ import annotations

import asyncio

from trajectory_ensemble_node.errors import CapacityError, ErrorCode
from trajectory_ensemble_node.openpi.gate import InboundBudget


def test_past_the_budget_connections_read_one_at_a_time_in_arrival_order():
    async def run() -> list[str]:
        budget = InboundBudget(100)
        order: list[str] = []
        budget.take(120)  # one frame took the total past the limit
        assert budget.full and not budget.has_room()

        async def reader(name: str) -> None:
            await budget.wait_for_room()
            order.append(name)

        tasks = [asyncio.ensure_future(reader(name)) for name in ("a", "b", "c")]
        await asyncio.sleep(0)
        assert budget.waiting == 3 and order == []
        budget.give_back(120)  # room: the first in line reads; the others wait for it to take its frame
        await asyncio.sleep(0)
        assert order == ["a"] and budget.waiting == 2
        budget.take(60)  # its frame: room is left, so the next may read
        await asyncio.sleep(0)
        assert order == ["a", "b"]
        budget.take(60)  # past the limit again: "c" waits
        await asyncio.sleep(0)
        assert order == ["a", "b"] and budget.waiting == 1
        budget.give_back(60)
        await asyncio.gather(*tasks)
        assert budget.peak == 120 and budget.held == 60
        return order

    assert asyncio.run(run()) == ["a", "b", "c"]


def test_a_turn_passed_on_by_a_connection_with_nothing_to_read_wakes_the_next():
    async def run() -> None:
        budget = InboundBudget(100)
        budget.take(100)
        waiters = [asyncio.ensure_future(budget.wait_for_room()) for _ in range(2)]
        await asyncio.sleep(0)
        budget.give_back(50)
        await asyncio.sleep(0)
        assert waiters[0].done() and not waiters[1].done()
        budget.pass_turn()  # the first had nothing to send
        await asyncio.sleep(0)
        assert waiters[1].done()

    asyncio.run(run())


def test_a_canceled_waiter_that_was_woken_passes_its_turn_on():
    async def run() -> None:
        budget = InboundBudget(100)
        budget.take(100)
        first, second = (asyncio.ensure_future(budget.wait_for_room()) for _ in range(2))
        await asyncio.sleep(0)
        budget.give_back(10)  # wakes the first ...
        first.cancel()  # ... whose connection closes before it runs
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert second.done() and budget.waiting == 0

    asyncio.run(run())


def test_a_frame_read_while_the_budget_is_full_is_refused_by_name():
    budget = InboundBudget(64)
    budget.take(64)
    refusal = budget.refusal()
    assert isinstance(refusal, CapacityError) and refusal.code == ErrorCode.CAPACITY
    assert "openpi_max_inbound_bytes=64" in str(refusal)
