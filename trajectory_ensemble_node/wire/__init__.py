"""The OpenPI wire, neutral ground for everything that speaks it: ``openpi/``, ``remote/`` and ``fleet/`` import it;
it imports none of them, nor rclpy. :mod:`.codec` is the frames and their bounds, :mod:`.schemas` the observation
keys (docs/openpi.md).
"""
