"""``make demo``'s harness and the toy task's simulated robot, beside :mod:`trajectory_ensemble_node.toy` they serve.

Its modules are listed in docs/development.md; PushT's simulator and demonstrations are the lab's. Modules that talk
to a node import rclpy inside the functions that need it, so everything here imports without ROS.
"""
