"""Moved to :mod:`trajectory_ensemble_node.serving.input_limits`; this old path re-exports it."""

from __future__ import annotations

from ..serving.input_limits import (  # noqa: F401 - the old public path
    InputLimits,
    MIN_IMAGE_SIDE,
    TokenCounter,
    check_image_dimensions,
    check_image_size,
    check_instruction,
    check_joint_state_shape,
    check_state,
    min_image_side,
    state_values,
    token_counter,
)

__all__ = [
    "InputLimits",
    "MIN_IMAGE_SIDE",
    "TokenCounter",
    "check_image_dimensions",
    "check_image_size",
    "check_instruction",
    "check_joint_state_shape",
    "check_state",
    "min_image_side",
    "state_values",
    "token_counter",
]
