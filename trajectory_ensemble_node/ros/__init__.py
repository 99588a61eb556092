"""The ROS 2 side: the ``trajectory_ensemble`` node and its modules (the only package that imports rclpy)."""
