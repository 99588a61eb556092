"""Command-line entry points (placeholder until the engine lands; only makes the console scripts resolve)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

_MISSING = {
    "serve": "the ROS 2 node (trajectory_ensemble_node.ros)",
    "demo": "the engine and the tiny embedded Cosmos 3 model",
    "replay": "rosbag replay through the engine",
    "bench": "the batched-vs-sequential benchmark",
    "train-toy": "the toy training loop",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``trajectory-ensemble`` command; every subcommand is still a stub and returns 2."""
    parser = argparse.ArgumentParser(prog="trajectory-ensemble", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _MISSING:
        sub.add_parser(name)
    args = parser.parse_args(argv)
    print(f"not implemented yet: {_MISSING[args.command]}", file=sys.stderr)
    return 2


def node_main() -> int:
    """Run the ``trajectory_ensemble_node`` executable (what ``ros2 run``/``ros2 launch`` start)."""
    print(f"not implemented yet: {_MISSING['serve']}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
