"""trajectory_ensemble: N stochastic action candidates for one prediction, served from one batched denoising path.

The engine (``contract``, ``seeding``, ``reducers``, ``normalization``, ``engine``, ``models``) is plain Python and
torch and never imports rclpy; only ``trajectory_ensemble_node.ros`` does.
"""

__version__ = "0.1.0"
