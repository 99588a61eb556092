"""ros/deferred.py: work run after a delay, in order, coalesced by key, drained on stop."""

from __future__ import annotations

from _node_harness import wait_until


def test_deferred_work_runs_after_its_delay_in_order_coalesces_by_key_and_drains_on_stop():
    import time

    from trajectory_ensemble_node.ros.deferred import Deferred

    ran: list[tuple[str, float]] = []
    deferred = Deferred(0.05, "test-deferred")
    asked = time.monotonic()
    deferred.call(lambda: ran.append(("log", time.monotonic())))
    deferred.call(lambda: ran.append(("diagnostics", time.monotonic())), key="diagnostics")
    deferred.call(lambda: ran.append(("diagnostics", time.monotonic())), key="diagnostics")  # coalesced
    deferred.call(lambda: 1 / 0)  # swallowed: later work still runs
    deferred.call(ran.append, ("last", 0.0))
    wait_until(lambda: len(ran) == 3)
    assert [name for name, _ in ran] == ["log", "diagnostics", "last"]
    assert ran[0][1] - asked >= 0.045  # not before its delay: the result goes out first
    deferred.call(lambda: ran.append(("pending at stop", 0.0)))
    deferred.stop()
    assert ran[-1][0] == "pending at stop"
    deferred.call(lambda: ran.append(("after stop", 0.0)))
    assert ran[-1][0] == "pending at stop"
