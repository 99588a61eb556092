"""Experiments on the bundled toy task: training (:mod:`.train`, :mod:`.data`, :mod:`.augment`), open-loop quality
(:mod:`.quality`, :mod:`.report`), denoising steps (:mod:`.steps`), the in-process closed loop (:mod:`.closed_loop`,
:mod:`.closed_loop_report`), serving-path probes (:mod:`.sensitivity`) and the GRPO policy (:mod:`.grpo`).

The task itself (scenes, expert, rendering) and the shipped policy are the product's,
:mod:`trajectory_ensemble_node.toy`.
"""
