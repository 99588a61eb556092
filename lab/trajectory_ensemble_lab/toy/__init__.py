"""Experiments on the bundled toy task: training (:mod:`.train`, :mod:`.data`, :mod:`.augment`), open-loop quality
(:mod:`.quality`, :mod:`.report`), denoising steps (:mod:`.steps`), the in-process closed loop (:mod:`.closed_loop`,
:mod:`.closed_loop_report`), serving-path probes (:mod:`.sensitivity`), the GRPO policy (:mod:`.grpo`), and the
shifted scene families (:mod:`.shifted`) with ``calibrate``'s toy-scene mode (:mod:`.scene_calibration`), which the
product's ``calibrate`` imports by name when the lab is installed.

The task itself (scenes, expert, rendering) and the shipped policy are the product's,
:mod:`trajectory_ensemble_node.toy`.
"""
