"""The engine hands freed heap memory back to the OS when it goes idle (``engine/heap.py``)."""

from __future__ import annotations

import platform
import threading

import pytest
from _cosmos3 import FPS, PROMPT, STEPS, candidate_spec, fresh_pipe, policy

from trajectory_ensemble_node.engine import heap
from trajectory_ensemble_node.engine import scheduler as scheduler_module
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is a glibc function")
def test_trim_heap_finds_malloc_trim_on_glibc_and_reports_a_bool():
    assert heap._malloc_trim() is not None
    blocks = [bytearray(4 << 20) for _ in range(16)]
    del blocks[::2]  # free pages in the middle of the heap, what the allocator keeps
    assert isinstance(heap.trim_heap(), bool)


def test_the_engine_trims_once_each_time_it_goes_idle(monkeypatch):
    trims: list[int] = []
    trimmed = threading.Condition()

    def spy() -> bool:
        with trimmed:
            trims.append(1)
            trimmed.notify_all()
        return True

    monkeypatch.setattr(scheduler_module, "trim_heap", spy)
    model = Cosmos3ActionModel(fresh_pipe(), max_batch_candidates=8)
    model.start()
    try:
        for expected in (1, 2):
            handle = model.submit(prompt=PROMPT, action=policy(), num_inference_steps=STEPS, guidance_scale=1.0,
                                  fps=FPS, spec=candidate_spec(2), base_seed=expected)
            handle.result(timeout=120)
            with trimmed:
                assert trimmed.wait_for(lambda: len(trims) >= expected, timeout=60)
            assert len(trims) == expected, "trimmed between denoising steps, or more than once per idle spell"
    finally:
        model.stop()
