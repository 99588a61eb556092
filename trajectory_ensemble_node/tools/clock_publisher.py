"""Old path of :mod:`trajectory_ensemble_node.demo.clock_publisher`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..demo.clock_publisher import (
    ClockPublisher, GAZEBO_CLOCK_HZ, SimClock,
)

__all__ = [
    "ClockPublisher", "GAZEBO_CLOCK_HZ", "SimClock",
]
