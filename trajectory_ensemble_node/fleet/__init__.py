"""Replicas behind Ray Serve with the OpenPI wire at the front (``trajectory-ensemble serve-ray``).

Its modules are listed in docs/development.md and the design is docs/scaling.md. Only this package imports ``ray``
(the optional extra ``.[fleet]``).
"""
