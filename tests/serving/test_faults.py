"""serving/faults.py: the test-only fault injector fires once, then the adapter is back to normal."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trajectory_ensemble_node.serving.faults import FaultInjector


def test_fault_injector_fires_once_then_the_adapter_is_back_to_normal():
    output = SimpleNamespace(candidates=torch.zeros(2, 3))
    adapter = SimpleNamespace(forward=lambda slices, should_abort=None: 1, finish=lambda state: output)
    faults = FaultInjector(adapter)
    faults.arm("engine_exception")
    with pytest.raises(RuntimeError, match="injected"):
        adapter.forward([])
    assert adapter.forward([]) == 1 and faults.armed is None
    faults.arm("out_of_memory")
    with pytest.raises(torch.OutOfMemoryError):
        adapter.forward([])
    faults.arm("nan_candidates")
    assert torch.isnan(adapter.finish(None).candidates).all()
    with pytest.raises(ValueError, match="unknown fault"):
        faults.arm("meteor")


def test_the_nan_fault_corrupts_only_the_chosen_candidates():
    class Adapter:
        def forward(self, slices, should_abort=None):
            return 0

        def finish(self, state):
            return SimpleNamespace(candidates=torch.zeros(4, 8, 2))

    injector = FaultInjector(Adapter(), step_delay_s=0.0)
    injector.arm("nan_candidates:1,3")
    out = injector._adapter.finish(None).candidates
    assert [bool(torch.isnan(c).all()) for c in out] == [False, True, False, True]
    assert not torch.isnan(injector._adapter.finish(None).candidates).any()  # it fires once
    with pytest.raises(ValueError):
        injector.arm("nan_candidates:x")
