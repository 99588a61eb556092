"""Names that say one thing (issue 46): the noise scheduler's copies are the "stepper state" (issue 57: the names from
before, ``vision_scheduler`` and ``action_scheduler``, went with the other shims)."""

from __future__ import annotations

import torch
from diffusers import UniPCMultistepScheduler

from trajectory_ensemble_node.models.cosmos3.steppers import PipelineStepper


def test_the_stepper_state_is_a_vision_copy_and_an_action_copy_only_with_actions():
    stepper = PipelineStepper(UniPCMultistepScheduler(), 4, torch.device("cpu"))
    assert stepper.action_state is not None and stepper.action_state is not stepper.vision_state
    without_action = PipelineStepper(UniPCMultistepScheduler(), 4, torch.device("cpu"), has_action=False)
    assert without_action.action_state is None
    assert stepper.num_steps == 4 and stepper.sigmas is stepper.vision_state.sigmas
