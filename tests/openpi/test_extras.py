"""Per-request extras of the OpenPI face (``openpi/extras.py``): each is checked like the same field of a ROS goal,
with the same error and text, and becomes the same plan."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trajectory_ensemble_node.errors import (
    CandidateCountError,
    DelayTooLongError,
    ExecutionContextError,
    GoalRequestError,
    InvalidSpecError,
    UnknownReducerError,
)
from trajectory_ensemble_node.openpi.extras import parse_extras, plan_request
from trajectory_ensemble_node.ros.goals import plan_action_goal
from trajectory_ensemble_node.serving.params import validate

VALID_REDUCERS = ("mean", "median", "medoid", "mode", "backward_coherence", "mode_continuity")


@pytest.mark.parametrize(("obs", "error", "quoted"), [
    ({"num_candidates": "4"}, InvalidSpecError, "num_candidates must be an integer, got str '4'"),
    ({"num_candidates": True}, InvalidSpecError, "got bool True"),
    ({"seed": 1.5}, InvalidSpecError, "seed must be an integer"),
    ({"reducer": 3}, InvalidSpecError, "reducer must be a string"),
    ({"return_candidates": 1}, InvalidSpecError, "return_candidates must be true or false"),
    ({"deadline_ms": -1}, GoalRequestError, "deadline_ms must be >= 0"),
    ({"deadline_ms": "soon"}, GoalRequestError, "deadline_ms must be a number"),
    ({"endpoint": "train"}, GoalRequestError, "'train'"),
    ({"stamp": float("nan")}, GoalRequestError, "stamp must be finite"),
    ({"session_id": "x" * 300}, GoalRequestError, "at most 256 characters"),
    ({"guidance": 1}, GoalRequestError, "guidance must be a string, got int 1"),
])
def test_extras_of_the_wrong_type_are_named(obs, error, quoted):
    with pytest.raises(error) as caught:
        parse_extras(obs)
    assert quoted in str(caught.value)


def _goal(**fields):
    defaults = {"candidate_count": 0, "reducer": "", "return_candidates": False, "use_seed": False, "seed": 0,
                "instruction": "", "rollout": False, "continue_previous": False, "reset_context": False,
                "inference_delay": 0, "guidance": "", "deadline": None, "min_observation_stamp": None}
    return SimpleNamespace(**{**defaults, **fields})


@pytest.mark.parametrize(("extras", "goal"), [
    ({"num_candidates": 99}, {"candidate_count": 99}),
    ({"reducer": "nope"}, {"reducer": "nope"}),
    ({"reducer": "pose_gripper"}, {"reducer": "pose_gripper"}),
    ({"num_candidates": 2, "reducer": "none"}, {"candidate_count": 2, "reducer": "none"}),
    ({"inference_delay": 8}, {"inference_delay": 8}),
    ({"inference_delay": -1}, {"inference_delay": -1}),
    ({"continue_previous": True, "guidance": "sideways"}, {"continue_previous": True, "guidance": "sideways"}),
])
def test_an_extra_gets_the_same_error_and_text_as_the_same_goal(extras, goal):
    params = validate({})
    with pytest.raises(Exception) as over_the_wire:
        plan_request(parse_extras(extras), "", params, default_instruction=params.instruction,
                     valid_reducers=VALID_REDUCERS)
    with pytest.raises(Exception) as as_a_goal:
        plan_action_goal(_goal(**goal), params, default_instruction=params.instruction, valid_reducers=VALID_REDUCERS)
    assert type(over_the_wire.value) is type(as_a_goal.value)
    assert str(over_the_wire.value) == str(as_a_goal.value)
    assert isinstance(over_the_wire.value, (CandidateCountError, UnknownReducerError, InvalidSpecError,
                                            DelayTooLongError, ExecutionContextError))


def test_defaults_seed_and_deadline_become_the_goals_plan():
    params = validate({})
    plan = plan_request(parse_extras({"seed": 2**64 - 1, "num_candidates": 3, "deadline_ms": 250,
                                      "return_candidates": True}), "", params,
                        default_instruction=params.instruction, valid_reducers=VALID_REDUCERS)
    assert plan.base_seed == 2**64 - 1 and plan.spec.count == 3 and plan.spec.reducer == params.reducer
    assert plan.deadline_s == pytest.approx(0.25) and plan.return_candidates and plan.instruction == params.instruction
    continued = plan_request(parse_extras({"continue_previous": True}), "go", params,
                             default_instruction=params.instruction, valid_reducers=VALID_REDUCERS)
    assert continued.continue_previous and continued.spec.reducer == params.continuity_reducer
    assert continued.instruction == "go" and continued.spec.count == params.candidate_count
    assert continued.guidance == params.guidance_mode
    unguided = plan_request(parse_extras({"continue_previous": True, "guidance": "none"}), "go", params,
                            default_instruction=params.instruction, valid_reducers=VALID_REDUCERS)
    assert unguided.guidance == "none"  # a request picks its guidance as a goal does (bid: selection only)
