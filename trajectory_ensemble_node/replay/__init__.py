"""Bag replay and open-loop evaluation: a client of the node and of its recordings, never part of it.

``bags`` reads and records rosbag2 folders and makes the toy's demo bags (``trajectory-ensemble bags``);
``bag_check`` refuses a damaged bag before the node is contacted; ``playback`` times goals against bag time;
``replay`` plays a bag into a running node and records what it answers (``trajectory-ensemble replay``);
``reference``, ``open_loop`` and ``plots`` compare the served chunks with a recorded reference and draw them.

Only ``replay`` talks to the node, importing rclpy inside the functions that need it, so every module here imports
without ROS (the replay's timing and bookkeeping are unit-tested that way).
"""
