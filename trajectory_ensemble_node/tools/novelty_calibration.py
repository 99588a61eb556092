"""Old path of :mod:`trajectory_ensemble_node.calibration.novelty_calibration`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..calibration.novelty_calibration import (
    ALARM_RULES, AlarmRule, DEFAULT_FIT_SHARE, DEFAULT_SCORER, DETECTION_TARGET, EmbeddingSpec, FALSE_ALARM_MARGIN,
    Goals, NoveltyFit, NoveltyScorer, SCORER_KINDS, auroc, conformal_threshold, embed_frames, evaluate_rules,
    fit_scorer, fit_thresholds, from_episodes, other_scorers, paired_bootstrap_auroc, rate, recommend, wilson,
)

__all__ = [
    "ALARM_RULES", "AlarmRule", "DEFAULT_FIT_SHARE", "DEFAULT_SCORER", "DETECTION_TARGET", "EmbeddingSpec",
    "FALSE_ALARM_MARGIN", "Goals", "NoveltyFit", "NoveltyScorer", "SCORER_KINDS", "auroc", "conformal_threshold",
    "embed_frames", "evaluate_rules", "fit_scorer", "fit_thresholds", "from_episodes", "other_scorers",
    "paired_bootstrap_auroc", "rate", "recommend", "wilson",
]
