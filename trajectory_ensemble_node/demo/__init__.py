"""``make demo``'s harness and the toy task's simulated robot, beside :mod:`trajectory_ensemble_node.toy` they serve.

``demo`` runs the node on the bundled bag and a few closed-loop episodes and writes the figures under ``out/``;
``launcher`` starts the node as a child process (also for the tests and the lab's benches); ``sim``, ``sim_model``,
``sim_robot`` and ``sim_report`` are the toy's point robot as a ROS node (``trajectory-ensemble sim``), and
``clock_publisher`` its ``/clock``. The name says the task: PushT's simulator and demonstrations are the lab's.

Modules that talk to a node import rclpy inside the functions that need it, so everything here imports without ROS.
"""
