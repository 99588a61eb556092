"""Old path of :mod:`trajectory_ensemble_node.replay.bag_check`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..replay.bag_check import (
    CorruptMessageError, ReplayOptions, bags, check_messages, check_replay_bag, resolve_inputs,
)

__all__ = [
    "CorruptMessageError", "ReplayOptions", "bags", "check_messages", "check_replay_bag", "resolve_inputs",
]
