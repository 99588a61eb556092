"""Names that say one thing (issue 46): the noise scheduler's copies are the "stepper state"; the names from before
stay as aliases of the very same objects."""

from __future__ import annotations

import torch
from diffusers import UniPCMultistepScheduler

from trajectory_ensemble_node.models.cosmos3.steppers import PipelineStepper


def test_stepper_state_keeps_its_old_scheduler_names_as_aliases():
    stepper = PipelineStepper(UniPCMultistepScheduler(), 4, torch.device("cpu"))
    assert stepper.vision_scheduler is stepper.vision_state
    assert stepper.action_scheduler is stepper.action_state is not None
    without_action = PipelineStepper(UniPCMultistepScheduler(), 4, torch.device("cpu"), has_action=False)
    assert without_action.action_scheduler is None
    assert stepper.num_steps == 4 and stepper.sigmas is stepper.vision_state.sigmas
