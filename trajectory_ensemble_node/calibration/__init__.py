"""``trajectory-ensemble calibrate``: the uncertainty threshold and the novelty scorer from a team's own recordings.

``calibrate`` holds the command's flags and picks the mode; ``bag_calibration`` replays recorded successful
episodes into the node (through :mod:`trajectory_ensemble_node.replay`) and calibrates on what it served;
``novelty_calibration`` fits the observation-novelty scorer and sets every alarm rule's thresholds. The toy-scene
mode is an experiment of the lab, imported by name only when the lab is installed.
"""
