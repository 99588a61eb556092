"""Replicas behind Ray Serve with the OpenPI wire at the front (``trajectory-ensemble serve-ray``).

- :mod:`.protocol`: what travels between the ingress and a replica (plain, picklable dicts; no ray import).
- :mod:`.replica`: the engine replica deployment: one model, its engine started, co-batching what is routed to it.
- :mod:`.backend`: the ingress's :class:`~trajectory_ensemble_node.openpi.policy.Backend` that forwards each built
  group to the replicas and completes a ``GroupHandle`` from the reply.
- :mod:`.app`: the Serve application (ingress + replicas) for ``serve run`` and ``serve-ray``.
- :mod:`.cli`: ``trajectory-ensemble serve-ray``.

Only this package imports ``ray`` (the optional extra ``.[fleet]``); the rest of the product never does.
"""
