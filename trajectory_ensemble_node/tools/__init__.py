"""Tools around the node, each a client of it or of its files, never part of it: rosbag2 files, bag replay, the
demo, plots of replayed goals, and the launcher that runs the node as a child process.

Modules that talk to a live node import rclpy inside the functions that need it, so everything here imports
without ROS (the replay's timing and bookkeeping are unit-tested that way).
"""
