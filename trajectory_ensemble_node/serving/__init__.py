"""What a request goes through on any face, without rclpy: the parameter table and its checks, request planning,
chunk memory and continuity planning, input limits, start-up loaders, the image codec, fault injection and the exit
deadline.

The node (``ros/``) and the OpenPI server (``openpi/``) are two faces over this package; neither imports the other.
"""
