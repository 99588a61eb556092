"""One factory builds the served model for every face (issue 46, acceptance 2).

Patching :func:`trajectory_ensemble_node.serving.model_factory.build_model` once reaches both the node's
:class:`~trajectory_ensemble_node.ros.model_host.ModelHost` and the OpenPI face's
:meth:`~trajectory_ensemble_node.openpi.OpenPIPolicy.from_params`; the real factory builds the tiny model with the
configured settings and refuses a reducer the model does not declare.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trajectory_ensemble_node.errors import ParameterError
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel
from trajectory_ensemble_node.serving import model_factory
from trajectory_ensemble_node.serving.params import validate


class _Built(Exception):
    """Raised by the patched factory: the face got as far as building its model, through the factory."""


def test_both_faces_build_their_model_through_the_one_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("rclpy")
    from trajectory_ensemble_node.openpi import OpenPIPolicy
    from trajectory_ensemble_node.ros.model_host import ModelHost

    seen: list[tuple[str, Any]] = []

    def patched(params: Any, **_: Any) -> Cosmos3ActionModel:
        seen.append(("built", params))
        raise _Built

    monkeypatch.setattr(model_factory, "build_model", patched)
    params = validate({"model": "tiny"})
    with pytest.raises(_Built):
        OpenPIPolicy.from_params(params)
    with pytest.raises(_Built):
        # The factory is the first thing configure does after naming the phase: no node method is reached.
        ModelHost(object(), params, object(), log=lambda _line: None)
    assert seen == [("built", params), ("built", params)]


def test_the_factory_builds_the_configured_model() -> None:
    params = validate({"model": "tiny", "max_candidates": 4, "candidate_count": 2, "max_batch_candidates": 3,
                       "prefix_retain": 0, "reducer": "medoid"})
    model = model_factory.build_model(params)
    try:
        assert isinstance(model, Cosmos3ActionModel)
        assert model.max_candidates == 4 and model.engine.config.max_batch_candidates == 3
        assert model.validity.limits is None
    finally:
        model.stop(1.0)


def test_the_factory_refuses_a_reducer_the_model_does_not_declare(monkeypatch: pytest.MonkeyPatch) -> None:
    params = validate({"model": "tiny", "reducer": "medoid"})
    monkeypatch.setattr(Cosmos3ActionModel, "valid_reducers", lambda self: ("mean",))
    with pytest.raises(ParameterError, match="reducer"):
        model_factory.build_model(params)


def test_mode_threshold_is_served_by_mode_and_the_relative_rule_by_default() -> None:
    from trajectory_ensemble_node.contract import CandidateTrajectorySpec
    from trajectory_ensemble_node.reducers import mode_reduce
    from tests._cosmos3 import PROMPT, STEPS, policy

    served = {}
    for threshold in (0.0, 0.05):
        model = model_factory.build_model(validate({"model": "tiny", "mode_threshold": threshold}))
        try:
            assert model.mode_threshold == (threshold or None)
            result = model.generate(prompt=PROMPT, action=policy(), num_inference_steps=STEPS, base_seed=7,
                                    spec=CandidateTrajectorySpec(count=6, reducer="mode", return_candidates=True))
        finally:
            model.stop(1.0)
        # The tiny model reduces in normalized space without statistics: the action is mode of the candidates.
        torch.testing.assert_close(result.action, mode_reduce(result.candidates, threshold or None))
        served[threshold] = result
    assert torch.equal(served[0.0].candidates, served[0.05].candidates)  # reducers run after the candidates
