"""Bag replay and open-loop evaluation: a client of the node and of its recordings, never part of it.

Its modules are listed in docs/development.md. Only ``replay`` talks to the node, importing rclpy inside the functions
that need it, so every module here imports without ROS.
"""
