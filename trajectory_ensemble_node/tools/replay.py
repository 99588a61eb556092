"""Old path of :mod:`trajectory_ensemble_node.replay.replay`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..replay.replay import (
    ClientSession, DEFAULT_WAIT_S, DISCOVERY_SETTLE_S, DRAIN_S, EXIT_BAD_INPUT, EXIT_GOALS_FAILED, EXIT_OK,
    EXIT_UNREACHABLE, ErrorCode, FRAME_RESENDS, GateLimitError, GoalOutcome, NodeUnreachableError, OUTPUT_WAIT_S,
    PARAMETER_WAIT_S, PlaybackClock, ReferenceError, ReferenceSeries, ReplayOptions, ReplayReport, SETTLE_S,
    add_arguments, bags, check_gate, check_limit_names, check_replay_bag, domain_text, finish, goal_times,
    options_from_args, parse_channel_limit, read_reference, reference_lines, replay, resolve_inputs, run,
    wait_with_progress,
)

__all__ = [
    "ClientSession", "DEFAULT_WAIT_S", "DISCOVERY_SETTLE_S", "DRAIN_S", "EXIT_BAD_INPUT", "EXIT_GOALS_FAILED",
    "EXIT_OK", "EXIT_UNREACHABLE", "ErrorCode", "FRAME_RESENDS", "GateLimitError", "GoalOutcome",
    "NodeUnreachableError", "OUTPUT_WAIT_S", "PARAMETER_WAIT_S", "PlaybackClock", "ReferenceError",
    "ReferenceSeries", "ReplayOptions", "ReplayReport", "SETTLE_S", "add_arguments", "bags", "check_gate",
    "check_limit_names", "check_replay_bag", "domain_text", "finish", "goal_times", "options_from_args",
    "parse_channel_limit", "read_reference", "reference_lines", "replay", "resolve_inputs", "run",
    "wait_with_progress",
]

if __name__ == "__main__":
    import argparse
    import sys

    _parser = argparse.ArgumentParser(prog="trajectory-ensemble replay")
    add_arguments(_parser)
    sys.exit(run(_parser.parse_args()))
