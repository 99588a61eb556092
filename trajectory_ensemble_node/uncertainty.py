"""How much a group's candidates disagree: a nearly free uncertainty signal, computed in normalized space.

The quantities (``uncertainty_modes``, ``_mode_share``, ``_spread``, ``_step_std``, ``_score``) and the alarm rules
(:class:`AlarmRule`: ``spread``, ``novelty``, ``either``, ``both``) are defined in docs/safety-and-uncertainty.md,
"2. Uncertainty, calibrated". Thresholds come from one ``calibrate`` JSON (:func:`load_calibration`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from .errors import NoveltyScorerError
from .novelty import NoveltyReport, NoveltyScorer, file_sha256, load_scorer
from .reducers import mode_clusters

ALARM_RULES = ("spread", "novelty", "either", "both")
"""Which scores raise ``uncertain`` (docs/safety-and-uncertainty.md); ``both`` is FIPER's."""


@dataclass(frozen=True)
class Uncertainty:
    """Disagreement of one group's candidates (definitions in docs/safety-and-uncertainty.md).

    Args:
        modes (`int`), mode_share (`float`), spread (`float`), step_std (`tuple[float, ...]`, length H),
        score (`float`), candidates (`int`): how many candidates it was computed from.
    """

    modes: int
    mode_share: float
    spread: float
    step_std: tuple[float, ...]
    score: float
    candidates: int

    def __post_init__(self) -> None:
        for name in ("mode_share", "spread", "score"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"uncertainty {name} must be finite and >= 0, got {value!r}")

    def report(self, threshold: float | None = None) -> UncertaintyReport:
        """The spread as a result reports it; with ``threshold``, also ``uncertain`` (score above it)."""
        return UncertaintyReport(
            modes=self.modes, mode_share=self.mode_share, spread=self.spread, step_std=self.step_std,
            step_std_max=max(self.step_std) if self.step_std else 0.0, score=self.score,
            threshold=None if threshold is None else float(threshold),
            uncertain=None if threshold is None else bool(self.score > threshold))


@dataclass(frozen=True)
class UncertaintyReport:
    """A group's uncertainty as a result reports it: the spread, the alarm's verdict, novelty, a node's window.

    ``None``: not reported (e.g. ``rule`` without a novelty scorer, ``window`` outside a node's aggregation window).

    Args:
        modes (`int`): ``uncertainty_modes``. mode_share (`float`): ``uncertainty_mode_share``.
        spread (`float`): ``uncertainty_spread``.
        step_std (`tuple[float, ...]`, length H): ``uncertainty_step_std``, numbers in process; a wire sends them
            as text (:func:`~trajectory_ensemble_node.metrics.numbers_text`).
        step_std_max (`float`): ``uncertainty_step_std_max``. score (`float`): ``uncertainty_score``.
        rule (`str`): ``uncertainty_rule``, with a novelty scorer. uncertain (`bool`): ``uncertain``.
        threshold (`float`): ``uncertainty_threshold``, the spread threshold in force.
        novelty (`NoveltyReport`): the novelty entries.
        window (`int`), score_window (`float`): ``uncertainty_window``, ``uncertainty_score_window``.
    """

    modes: int | None = None
    mode_share: float | None = None
    spread: float | None = None
    step_std: tuple[float, ...] | None = None
    step_std_max: float | None = None
    score: float | None = None
    rule: str | None = None
    uncertain: bool | None = None
    threshold: float | None = None
    novelty: NoveltyReport | None = None
    window: int | None = None
    score_window: float | None = None

    @property
    def novelty_score(self) -> float | None:
        """``novelty_score``, ``None`` without a scorer."""
        return None if self.novelty is None else self.novelty.score

    @property
    def novel(self) -> bool | None:
        """``novel``, ``None`` without a scorer and a novelty threshold."""
        return None if self.novelty is None else self.novelty.novel

    def as_metrics(self) -> dict[str, Any]:
        """The entries that are set, in the order results carry them (the verdict after the spread; with a rule,
        ``uncertainty_rule, uncertain, uncertainty_threshold``, else ``uncertainty_threshold, uncertain``)."""
        verdict = ((("uncertainty_rule", self.rule), ("uncertain", self.uncertain),
                    ("uncertainty_threshold", self.threshold)) if self.rule is not None else
                   (("uncertainty_threshold", self.threshold), ("uncertain", self.uncertain)))
        entries = (("uncertainty_modes", self.modes), ("uncertainty_mode_share", self.mode_share),
                   ("uncertainty_spread", self.spread), ("uncertainty_step_std", self.step_std),
                   ("uncertainty_step_std_max", self.step_std_max), ("uncertainty_score", self.score), *verdict)
        out = {key: value for key, value in entries if value is not None}
        if self.novelty is not None:
            out.update(self.novelty.as_metrics())
        window = (("uncertainty_window", self.window), ("uncertainty_score_window", self.score_window))
        out.update((key, value) for key, value in window if value is not None)
        return out

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> UncertaintyReport:
        """The uncertainty entries of a flat metrics mapping (all ``None`` when it has none, e.g. a failed group).

        ``uncertainty_step_std`` is read as the numbers it is in process; text (a wire's) is not parsed back.
        """
        step_std = metrics.get("uncertainty_step_std")
        return cls(
            modes=metrics.get("uncertainty_modes"), mode_share=metrics.get("uncertainty_mode_share"),
            spread=metrics.get("uncertainty_spread"),
            step_std=tuple(float(v) for v in step_std) if isinstance(step_std, (tuple, list)) else None,
            step_std_max=metrics.get("uncertainty_step_std_max"), score=metrics.get("uncertainty_score"),
            rule=metrics.get("uncertainty_rule"), uncertain=metrics.get("uncertain"),
            threshold=metrics.get("uncertainty_threshold"), novelty=NoveltyReport.from_metrics(metrics),
            window=metrics.get("uncertainty_window"), score_window=metrics.get("uncertainty_score_window"))


def estimate_uncertainty(candidates: torch.Tensor, threshold: float | None = None) -> Uncertainty:
    """Uncertainty of a group from its (valid) candidates.

    The calibrated score (``uncertainty_score``, the nearest-neighbour spread) never clusters, so a threshold
    calibrated before the relative ``mode`` rule keeps its meaning; only the mode count and share follow the cut.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates in normalized (model) space.
        threshold (`float`, *optional*): A fixed cluster diameter for the mode count; ``None`` (default): the
            ``mode`` reducer's relative rule.

    Returns:
        `Uncertainty`
    """
    if candidates.ndim != 3 or candidates.shape[0] < 1:
        raise ValueError(f"candidates must be [N >= 1, H, D], got shape {tuple(candidates.shape)}")
    x = candidates.detach().to("cpu", torch.float64)
    n, horizon = x.shape[0], x.shape[1]
    if n == 1:
        return Uncertainty(1, 1.0, 0.0, tuple(0.0 for _ in range(horizon)), 0.0, 1)
    flat = x.reshape(n, -1)
    distance = torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist") / math.sqrt(flat.shape[1])
    off = ~torch.eye(n, dtype=torch.bool)
    spread = float(distance[off].mean())
    nearest = float(distance.masked_fill(~off, math.inf).min(dim=1).values.mean())
    clusters = mode_clusters(x, threshold)
    step_std = x.std(dim=0, unbiased=False).mean(dim=-1)
    return Uncertainty(
        modes=len(clusters),
        mode_share=max(len(c) for c in clusters) / n,
        spread=spread,
        step_std=tuple(float(v) for v in step_std),
        score=nearest,
        candidates=n,
    )


def _threshold(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class AlarmRule:
    """The alarm rule in force and the thresholds it compares the scores with.

    Args:
        rule (`str`): One of :data:`ALARM_RULES`.
        spread_threshold (`float`, *optional*): Compared with ``uncertainty_score``; needed by every rule but
            ``novelty``.
        novelty_threshold (`float`, *optional*): Compared with ``novelty_score``; needed by every rule but
            ``spread``, and for ``novel``.

    Raises:
        ValueError: unknown rule (quoted), a threshold the rule needs is missing, or one is not finite and >= 0.
    """

    rule: str
    spread_threshold: float | None = None
    novelty_threshold: float | None = None

    def __post_init__(self) -> None:
        if self.rule not in ALARM_RULES:
            raise ValueError(f"alarm rule must be one of {list(ALARM_RULES)}, got {self.rule!r}")
        object.__setattr__(self, "spread_threshold", _threshold(self.spread_threshold, "spread_threshold"))
        object.__setattr__(self, "novelty_threshold", _threshold(self.novelty_threshold, "novelty_threshold"))
        if self.rule != "novelty" and self.spread_threshold is None:
            raise ValueError(f"alarm rule {self.rule!r} needs a spread threshold")
        if self.rule != "spread" and self.novelty_threshold is None:
            raise ValueError(f"alarm rule {self.rule!r} needs a novelty threshold")

    def decide(self, spread: float, novelty: float | None) -> tuple[bool, bool | None]:
        """``(uncertain, novel)`` for a spread score and a novelty score (``None``: no scorer; ``novel`` is then
        ``None``).

        Fails closed: a NaN or infinite novelty score (a scorer that overflowed) is novel and uncertain under every
        rule, because ``nan > threshold`` is False and would otherwise read as familiar."""
        if novelty is not None and not math.isfinite(novelty):
            return True, True
        over_spread = self.spread_threshold is not None and spread > self.spread_threshold
        novel = None if novelty is None or self.novelty_threshold is None else bool(novelty > self.novelty_threshold)
        if self.rule == "spread":
            return bool(over_spread), novel
        if novelty is None:
            raise ValueError(f"alarm rule {self.rule!r} needs a novelty score")
        if self.rule == "novelty":
            return bool(novel), novel
        if self.rule == "either":
            return bool(over_spread or novel), novel
        return bool(over_spread and novel), novel

    def score(self, spread: float, novelty: float | None) -> float:
        """The rule as one number: each score over its threshold, combined by max (``either``) or min (``both``).

        ``decide`` raises ``uncertain`` exactly when this exceeds 1 (for positive thresholds); ``calibrate`` ranks
        goals by it for the failure AUROC of each rule.
        """
        def ratio(value: float, threshold: float | None) -> float:
            if threshold is None:
                return 0.0
            return value / threshold if threshold > 0 else (math.inf if value > 0 else 0.0)

        s = ratio(spread, self.spread_threshold)
        n = 0.0 if novelty is None else ratio(novelty, self.novelty_threshold)
        return {"spread": s, "novelty": n, "either": max(s, n), "both": min(s, n)}[self.rule]


@dataclass(frozen=True)
class NoveltyCheck:
    """A fitted novelty scorer plus the rule and thresholds calibrated with it (what the engine applies per group).

    Args:
        scorer (`NoveltyScorer`): Scores the group's observation embedding.
        alarm (`AlarmRule`): Decides ``uncertain`` and ``novel``.
    """

    scorer: NoveltyScorer
    alarm: AlarmRule

    def report(self, uncertainty: Uncertainty, embedding: torch.Tensor) -> UncertaintyReport:
        """The group's spread, novelty and the rule's verdict.

        Args:
            uncertainty (`Uncertainty`): The group's spread.
            embedding (`torch.Tensor` of shape `[D]`): The group's observation embedding.
        """
        return alarm_report(uncertainty.report(None), self.scorer.score(embedding), self.alarm)


def alarm_report(spread: UncertaintyReport, novelty: float | None, alarm: AlarmRule) -> UncertaintyReport:
    """``spread`` with the rule's verdict and the novelty entries, decided by ``alarm``: ``uncertainty_rule``,
    ``uncertain``, ``uncertainty_threshold`` (the spread threshold in force; absent under ``novelty``),
    ``novelty_score``, ``novelty_fault`` (a non-finite score), ``novelty_threshold`` and ``novel``.

    Args:
        spread (`UncertaintyReport`): The spread entries (``score`` is what the rule compares).
        novelty (`float`, *optional*): The novelty score; ``None`` without a scorer.
        alarm (`AlarmRule`): The rule and its thresholds.
    """
    uncertain, novel = alarm.decide(float(spread.score or 0.0), novelty)
    report = NoveltyReport()
    if novelty is not None:
        fault = (None if math.isfinite(novelty) else
                 f"novelty score {float(novelty)!r} is not finite: read as novel and uncertain")
        with_threshold = alarm.novelty_threshold is not None
        report = NoveltyReport(float(novelty), fault, alarm.novelty_threshold,
                               bool(novel) if with_threshold else None)
    threshold = alarm.spread_threshold if alarm.spread_threshold is not None and alarm.rule != "novelty" else None
    return replace(spread, rule=alarm.rule, uncertain=uncertain, threshold=threshold,
                   novelty=None if report == NoveltyReport() else report)


def load_calibration(path: str | Path, scorer_path: str | Path, rule: str = "") -> NoveltyCheck:
    """The novelty check a ``calibrate`` JSON and its scorer file define.

    Args:
        path (`str` or `Path`): ``calibrate`` JSON with ``observation`` and ``combined`` (``combined.rules[rule]``
            holds each rule's thresholds).
        scorer_path (`str` or `Path`): The scorer file; its sha256 must be ``observation.scorer_sha256``.
        rule (`str`): One of :data:`ALARM_RULES`; ``""`` = the JSON's recommended rule (``combined.rule``).

    Raises:
        NoveltyScorerError: the scorer is unreadable or is not the one this JSON was calibrated with.
        ValueError: the JSON has no novelty calibration, or the rule or its thresholds are invalid (quoted).
    """
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
        observation, combined = document["observation"], document["combined"]
        chosen = rule or combined["rule"]
        entry: Mapping[str, Any] = combined["rules"][chosen]
        spread_threshold, novelty_threshold = entry["spread_threshold"], entry["novelty_threshold"]
        expected = observation["scorer_sha256"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{str(path)!r} is not a trajectory-ensemble calibrate JSON with a novelty calibration for "
                         f"rule {rule or 'combined.rule'!r} ({type(error).__name__}: {error})") from None
    scorer = load_scorer(scorer_path)
    if file_sha256(scorer_path) != expected:
        raise NoveltyScorerError(f"novelty scorer {str(scorer_path)!r} is not the one {str(path)!r} was calibrated "
                                 f"with (sha256 differs from observation.scorer_sha256)")
    return NoveltyCheck(scorer, AlarmRule(chosen, spread_threshold, novelty_threshold))


def group_uncertainty(candidates: torch.Tensor, threshold: float | None, novelty: NoveltyCheck | None = None,
                      embedding: torch.Tensor | None = None) -> UncertaintyReport:
    """A finished group's uncertainty report.

    Without ``novelty`` this is exactly :meth:`Uncertainty.report` (the spread and ``uncertain`` against
    ``threshold``); with it, the spread plus the novelty entries and the rule's verdict, against the rule's own
    thresholds (:func:`alarm_report`).

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): The valid candidates, normalized space.
        threshold (`float`, *optional*): The spread threshold of a node without a scorer.
        novelty (`NoveltyCheck`, *optional*): The scorer and its calibrated rule.
        embedding (`torch.Tensor` of shape `[D]`, *optional*): The group's observation embedding (needed with
            ``novelty``).

    Raises:
        NoveltyScorerError: ``novelty`` is set but the model gave no embedding, or one that does not fit the scorer.
    """
    uncertainty = estimate_uncertainty(candidates)
    if novelty is None:
        return uncertainty.report(threshold)
    if embedding is None:
        raise NoveltyScorerError("a novelty scorer is configured but the model returned no observation embedding")
    # The rule's own thresholds replace ``threshold`` (``either`` calibrates the spread at alpha / 2).
    return novelty.report(uncertainty, embedding)


def alarm_in_force(novelty: NoveltyCheck | None, threshold: float | None) -> AlarmRule | None:
    """The rule the node decides ``uncertain`` by: the scorer's, else ``spread`` on the threshold, else none."""
    if novelty is not None:
        return novelty.alarm
    return AlarmRule("spread", threshold) if threshold is not None else None
