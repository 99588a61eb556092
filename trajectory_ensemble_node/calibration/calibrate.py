"""``trajectory-ensemble calibrate``: the uncertainty score's conformal threshold and the observation-novelty scorer.

``--bag BAG`` is the product's mode (:mod:`.bag_calibration`); without it, toy scenes and shifted families, the lab's
experiment (``trajectory_ensemble_lab.toy.scene_calibration``), imported by name, so the wheel carries neither (without
the lab this mode exits 2 and says what is missing). The JSON is what the node loads as
``uncertainty_calibration_file``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..cli.dispatch import lab_module
from ..novelty import SCORER_KINDS
from . import bag_calibration, novelty_calibration

DEFAULT_JSON = Path("bench/results/uncertainty-toy.json")
"""The toy-scene mode's output, which the ``--bag`` mode refuses to overwrite."""
SCENE_CALIBRATION_MODULE = "trajectory_ensemble_lab.toy.scene_calibration"
"""The lab module that runs the toy-scene mode (``run(args) -> int``)."""
SHIFTED_MODULE = "trajectory_ensemble_lab.toy.shifted"
"""The lab module of the shifted scene families (``FAMILIES``: the ``--family`` choices)."""
EXIT_NO_LAB = 2
"""Exit status of the toy-scene mode when the lab is not installed (a usage error: ``--bag`` still works)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``calibrate``'s flags: the toy-scene mode's, then the ``--bag`` mode's
    (:func:`.bag_calibration.add_bag_arguments`).

    Args:
        parser (`argparse.ArgumentParser`): The ``calibrate`` subcommand's parser.
    """
    shifted = lab_module(SHIFTED_MODULE)
    # Without the lab the toy-scene mode cannot run (run() says so); --family then takes any name.
    families = shifted.FAMILIES if shifted is not None else None
    parser.add_argument("--scenes", type=int, default=100, help="calibration scenes K (in distribution)")
    parser.add_argument("--scene-seed", type=int, default=0, help="scene seed offset S")
    parser.add_argument("--alpha", type=float, default=0.05, help="target false-alarm rate")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="JSON output (markdown beside it)")
    parser.add_argument("--heldout", type=int, default=100, help="held-out in-distribution evaluation scenes")
    parser.add_argument("--shifted", type=int, default=100, help="shifted evaluation scenes")
    parser.add_argument("--family", choices=families, default="two_obstacles", help="shifted scene family")
    parser.add_argument("--count", type=int, default=8, help="candidates per scene")
    parser.add_argument("--reducer", default="mode", help="reducer (its output is scored for collisions)")
    parser.add_argument("--base-seed", type=int, default=0, help="candidate base seed of the first scene")
    parser.add_argument("--pipeline", type=Path, default=None, help="pipeline dir (default: the shipped toy)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--scene-batch", type=int, default=4, help="scenes submitted together (throughput only)")
    parser.add_argument("--scorer", choices=SCORER_KINDS, default=novelty_calibration.DEFAULT_SCORER,
                        help="novelty scorer kept (both are reported)")
    parser.add_argument("--scorer-out", type=Path, default=None,
                        help="novelty scorer file (default: beside the JSON, <json>.novelty.safetensors)")
    parser.add_argument("--fit-share", type=float, default=novelty_calibration.DEFAULT_FIT_SHARE,
                        help="share of the calibration scenes that fit the scorer; the rest set its thresholds")
    parser.add_argument("--embedding-grid", type=int, default=None,
                        help="pooling grid of the observation embedding (default: the model's)")
    parser.add_argument("--cost-groups", type=int, default=15,
                        help="groups timed with the novelty scorer on, and as many off (alternating; >= 5)")
    bag_calibration.add_bag_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Calibrate from bags (``--bag``), or on toy scenes through the lab; returns the mode's exit status.

    Args:
        args (`argparse.Namespace`): The flags of :func:`add_arguments`.

    Returns:
        `int`: 0 written; :data:`EXIT_NO_LAB` when the toy-scene mode is asked for without the lab installed; the
        ``--bag`` mode's own statuses otherwise (:func:`.bag_calibration.run`).
    """
    if getattr(args, "bag", None):  # episodes from a team's bags instead of toy scenes
        return bag_calibration.run(args, toy_json=DEFAULT_JSON)
    scenes = lab_module(SCENE_CALIBRATION_MODULE)
    if scenes is None:
        print(f"error: calibrate without --bag calibrates on toy scenes, an experiment of the lab "
              f"({SCENE_CALIBRATION_MODULE}), and trajectory_ensemble_lab is not installed. Pass --bag BAG to "
              f"calibrate on your own recorded episodes, or install the lab (pip install -e lab, as make test does).",
              file=sys.stderr)
        return EXIT_NO_LAB
    return int(scenes.run(args))
