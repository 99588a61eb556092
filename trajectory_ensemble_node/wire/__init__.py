"""The OpenPI wire, neutral ground for everything that speaks it: ``serve-openpi`` (``openpi/``), the node's remote
engine (``remote/``) and ``serve-ray`` (``fleet/``) import it; it imports none of them, nor rclpy.

- :mod:`.codec`: msgpack frames in openpi-client's numpy encoding, the decoder's bounds, and the error frame;
- :mod:`.schemas`: which request keys carry the image(s), state and prompt (``toy``, ``droid``), and their checks.

See docs/openpi.md.
"""
