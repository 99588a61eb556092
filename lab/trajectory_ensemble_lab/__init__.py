"""The trajectory_ensemble lab: the experiments beside the product, never in its wheel.

What a robot team installs is ``trajectory_ensemble_node`` (the node, the engine, the operator tools and the bundled
toy policy). What measures, trains and probes it lives here:

- :mod:`.bench`: ``trajectory-ensemble bench`` and its modes (batched vs sequential, serving, node overhead, and the
  toy-task quality and closed-loop measurements);
- :mod:`.toy`: training the toy policy (``train-toy``), its quality, steps, closed-loop and sensitivity probes;
- :mod:`.grpo`: Flow-GRPO fine-tuning of the toy policy (``train-grpo``), in process or through the node.

The lab imports the product; the product never imports the lab. Its commands reach ``trajectory-ensemble`` through
the ``trajectory_ensemble.commands`` entry-point group (``lab/pyproject.toml``), so they keep their names.
"""
