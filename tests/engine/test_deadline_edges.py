"""Deadline edge cases (issue 45, row 8) on the tiny real model.

- Any positive deadline is a deadline: ``deadline_ms: 1e-9`` (1e-12 s) used to round to 0, which means none, and was
  served with every step. Here it is refused with ``DEADLINE_UNMEETABLE`` (82), on a cold engine and on a warm one.
- ``DEADLINE_UNMEETABLE`` is decided before any model work, from the measured costs: the adapter's ``encode`` and
  ``prepare`` are counted on the real adapter (shadowed on the instance, as ``serving/faults.py`` does), and a refused
  group never reaches either, whether it is refused at submission or at admission after waiting in the queue.
"""

from __future__ import annotations

from typing import Any

import pytest
from _cosmos3 import FPS, PROMPT, policy

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.engine import deadline as deadline_module
from trajectory_ensemble_node.engine import run as run_module
from trajectory_ensemble_node.engine import scheduler as scheduler_module
from trajectory_ensemble_node.errors import DeadlineUnmeetableError, ErrorCode
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel, build_pipeline


def kwargs(**extra: Any) -> dict[str, Any]:
    spec = CandidateTrajectorySpec(count=2, reducer="mean", return_candidates=False)
    return dict(prompt=PROMPT, action=policy(), num_inference_steps=3, guidance_scale=1.0, fps=FPS, spec=spec,
                base_seed=7, **extra)


class ModelWork:
    """Counts the adapter's ``encode`` and ``prepare`` calls (instance attributes shadow its methods)."""

    def __init__(self, adapter: Any) -> None:
        self.encode = self.prepare = 0
        encode, prepare = adapter.encode, adapter.prepare

        def counted_encode(*args: Any, **kw: Any) -> Any:
            self.encode += 1
            return encode(*args, **kw)

        def counted_prepare(*args: Any, **kw: Any) -> Any:
            self.prepare += 1
            return prepare(*args, **kw)

        adapter.encode, adapter.prepare = counted_encode, counted_prepare

    def calls(self) -> tuple[int, int]:
        return self.encode, self.prepare


@pytest.fixture(scope="module")
def pipe():
    return build_pipeline("tiny", seed=0)


@pytest.fixture
def model(pipe) -> Cosmos3ActionModel:
    return Cosmos3ActionModel(pipe)


def test_check_deadline_keeps_every_positive_value_and_only_zero_means_none():
    for value in (1e-12, 5e-324, 1e-9, 0.25):
        assert deadline_module.check_deadline(value) == value
    assert deadline_module.check_deadline(0) is None and deadline_module.check_deadline(None) is None


def test_a_1e_9_ms_deadline_on_a_cold_engine_is_refused_at_admission_without_an_encode(model):
    work = model.instrument(ModelWork)
    assert model.engine.costs.minimum_ms() is None  # cold: nothing measured, so submission cannot judge it
    handle = model.submit(**kwargs(deadline_s=1e-12))
    model.run_until_idle()
    with pytest.raises(DeadlineUnmeetableError, match="left at admission .nothing measured yet.; refused before "
                                                      "encoding") as info:
        model.wait(handle, timeout=60)
    assert info.value.code == ErrorCode.DEADLINE_UNMEETABLE == 82 and "1e-12 s" in str(info.value)
    assert work.calls() == (0, 0)


def test_a_1e_9_ms_deadline_on_a_warm_engine_is_refused_at_submission_without_an_encode(model):
    work = model.instrument(ModelWork)
    model.generate(**kwargs())  # measures encode, step and post-processing
    assert model.engine.costs.minimum_ms() is not None and work.calls() == (1, 1)
    with pytest.raises(DeadlineUnmeetableError, match="deadline 1e-12 s is shorter than encoding"):
        model.submit(**kwargs(deadline_s=1e-12))
    assert work.calls() == (1, 1) and model.engine.num_queued == 0


def test_an_unmeetable_deadline_on_a_warm_engine_is_refused_from_the_measured_costs_before_the_encode(model):
    work = model.instrument(ModelWork)
    model.generate(**kwargs())
    minimum_s = model.engine.costs.minimum_ms() / 1000.0
    with pytest.raises(DeadlineUnmeetableError, match="as measured here"):
        model.submit(**kwargs(deadline_s=minimum_s / 2))
    assert work.calls() == (1, 1)


@pytest.mark.parametrize(("waited", "refused"), [(1.5, True), (0.1, False)], ids=["queue-ate-it", "time-left"])
def test_a_deadline_the_queue_ate_is_refused_at_admission_before_the_encode(model, monkeypatch, waited, refused):
    work = model.instrument(ModelWork)
    model.generate(**kwargs())
    minimum = model.engine.costs.minimum_ms()
    # The engine's clock, held still and moved by hand: the group waits exactly ``waited`` x the measured minimum in
    # the queue, whatever the machine's load. Its deadline (2 x the minimum) passes the submission check either way.
    clock = [1_000_000.0]
    for module in (scheduler_module, run_module):
        monkeypatch.setattr(module, "now_ms", lambda: clock[0])
    handle = model.submit(**kwargs(deadline_s=2 * minimum / 1000.0))
    clock[0] += waited * 2 * minimum
    model.run_until_idle()
    if refused:
        with pytest.raises(DeadlineUnmeetableError, match="left at admission"):
            model.wait(handle, timeout=60)
        assert work.calls() == (1, 1)  # only the warming group's
    else:
        result = model.wait(handle, timeout=60)
        assert result.metrics["deadline_met"] is True and work.calls() == (2, 2)
