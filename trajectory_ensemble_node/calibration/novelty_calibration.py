"""The novelty half of ``calibrate``: fit the scorer, set both conformal thresholds per alarm rule, evaluate every rule.

Shared by every source of episodes: per calibration goal its spread score and observation embedding come in; the
scorer file and the ``observation`` and ``combined`` sections of the calibrate JSON go out. The procedure
(:func:`fit_thresholds`: fit on a share, thresholds on the rest), the evaluation (:func:`evaluate_rules`) and the
recommended rule (:func:`recommend`): docs/safety-and-uncertainty.md, "2. Uncertainty, calibrated".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..novelty import SCORER_KINDS, EmbeddingSpec, NoveltyScorer, fit_scorer
from ..stats import auroc, conformal_threshold, paired_bootstrap_auroc, wilson
from ..uncertainty import ALARM_RULES, AlarmRule

DEFAULT_FIT_SHARE = 0.5
DEFAULT_SCORER = "knn"
"""The scorer ``calibrate`` keeps unless told: k-NN separated shifted scenes as well as RND or better in every
measurement on the toy task (``bench/results/novelty_embeddings-toy.md`` and the calibrate runs, which report both), and
it needs no training and no seed."""
DETECTION_TARGET = 0.8
FALSE_ALARM_MARGIN = 0.05


@dataclass
class NoveltyFit:
    """A fitted scorer and the thresholds of every rule.

    Args:
        scorer (`NoveltyScorer`): The kept scorer.
        rules (`dict[str, AlarmRule]`): Every rule of :data:`ALARM_RULES` with its calibrated thresholds.
        fit_count (`int`), threshold_count (`int`): Calibration goals that fit the scorer / set its thresholds.
        calibration_novelty (`list[float]`): Novelty scores of the threshold goals.
    """

    scorer: NoveltyScorer
    rules: dict[str, AlarmRule]
    fit_count: int
    threshold_count: int
    calibration_novelty: list[float]


def _finite(value: float, what: str, count: int, alpha: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{count} calibration goals give no finite {what} threshold at alpha {alpha:g} (the rank "
                         f"ceil((1 - alpha)(n + 1)) exceeds n); calibrate on more successful episodes")
    return value


def fit_thresholds(spread: Sequence[float], embeddings: torch.Tensor, embedding: EmbeddingSpec, alpha: float, *,
                   kind: str = DEFAULT_SCORER, fit_share: float = DEFAULT_FIT_SHARE, seed: int = 0) -> NoveltyFit:
    """Fit the scorer on the first ``fit_share`` of the calibration goals and set every rule's thresholds.

    Args:
        spread (`Sequence[float]`): ``uncertainty_score`` of each calibration goal.
        embeddings (`torch.Tensor` of shape `[K, D]`): Their observation embeddings, same order.
        embedding (`EmbeddingSpec`): What the embeddings are.
        alpha (`float`): Target false-alarm rate of every rule.
        kind (`str`): Scorer kept (:data:`~trajectory_ensemble_node.novelty.SCORER_KINDS`).
        fit_share (`float`): Share of the goals that fit the scorer, in (0, 1).
        seed (`int`): Seeds the RND target and predictor.

    Raises:
        ValueError: too few goals for finite thresholds, or mismatched inputs.
    """
    count = len(spread)
    if embeddings.shape[0] != count or not 0 < fit_share < 1:
        raise ValueError(f"{count} spread scores but {embeddings.shape[0]} embeddings, fit_share {fit_share!r}")
    n_fit = max(2, int(round(fit_share * count)))
    if count - n_fit < 1:
        raise ValueError(f"{count} calibration goals leave none to set the novelty threshold after fitting on "
                         f"{n_fit}")
    scorer = fit_scorer(kind, embeddings[:n_fit], embedding, seed=seed)
    novelty = [float(v) for v in scorer.scores(embeddings[n_fit:])]
    s_full = _finite(conformal_threshold(spread, alpha), "spread", count, alpha)
    s_half = _finite(conformal_threshold(spread, alpha / 2), "spread", count, alpha / 2)
    n_full = _finite(conformal_threshold(novelty, alpha), "novelty", len(novelty), alpha)
    n_half = _finite(conformal_threshold(novelty, alpha / 2), "novelty", len(novelty), alpha / 2)
    rules = {
        "spread": AlarmRule("spread", s_full, n_full),
        "novelty": AlarmRule("novelty", s_full, n_full),
        "either": AlarmRule("either", s_half, n_half),
        "both": AlarmRule("both", s_full, n_full),
    }
    return NoveltyFit(scorer, rules, n_fit, len(novelty), novelty)


def rate(flags: Sequence[bool]) -> dict[str, Any]:
    """A rate with its count and Wilson 95 % interval."""
    hits = int(sum(bool(f) for f in flags))
    return {"rate": hits / max(len(flags), 1), "count": hits, "of": len(flags), "ci95": list(wilson(hits, len(flags)))}


@dataclass(frozen=True)
class Goals:
    """Scores of a set of evaluated goals, and whether each served chunk failed.

    Args:
        spread (`Sequence[float]`), novelty (`Sequence[float]`): Per goal.
        failed (`Sequence[bool]`): Per goal: did the served chunk fail (toy task: collide)?
    """

    spread: Sequence[float]
    novelty: Sequence[float]
    failed: Sequence[bool]


def _scores(rule: AlarmRule, goals: Goals) -> np.ndarray:
    return np.array([rule.score(s, n) for s, n in zip(goals.spread, goals.novelty)], dtype=np.float64)


def evaluate_rules(rules: Mapping[str, AlarmRule], heldout: Goals, shifted: Goals, alpha: float,
                   seed: int = 0) -> dict[str, dict[str, Any]]:
    """Every rule's false alarms, detections, shift AUROC and failure AUROC (module docstring).

    Returns:
        `dict[str, dict]`: per rule name, JSON-ready figures.
    """
    failed = np.array(list(heldout.failed) + list(shifted.failed), dtype=bool)
    pooled = {name: np.concatenate([_scores(rule, heldout), _scores(rule, shifted)]) for name, rule in rules.items()}
    out: dict[str, dict[str, Any]] = {}
    for name, rule in rules.items():
        in_flags = [rule.decide(s, n)[0] for s, n in zip(heldout.spread, heldout.novelty)]
        sh_flags = [rule.decide(s, n)[0] for s, n in zip(shifted.spread, shifted.novelty)]
        boot = paired_bootstrap_auroc(failed, pooled[name], pooled["spread"], seed=seed)
        false_alarms, detections = rate(in_flags), rate(sh_flags)
        out[name] = {
            "rule": name,
            # Kept for every rule: `novelty` ignores it, but the thresholds of one calibration travel together.
            "spread_threshold": rule.spread_threshold,
            "novelty_threshold": rule.novelty_threshold,
            "false_alarm_rate": false_alarms["rate"],
            "detection_rate": detections["rate"],
            "auroc": auroc(list(_scores(rule, heldout)), list(_scores(rule, shifted))),
            "failure_auroc": auroc(list(pooled[name][~failed]), list(pooled[name][failed])),
            "failure_auroc_ci95": boot["ci_a"],
            "margin_over_spread": {"delta": boot["difference"], "ci95": boot["ci_difference"]},
            "false_alarms": false_alarms,
            "detections": detections,
            "false_alarm_ok": false_alarms["rate"] <= alpha + FALSE_ALARM_MARGIN,
            "detection_ok": detections["rate"] >= DETECTION_TARGET,
        }
    return out


def recommend(figures: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    """The recommended rule and why (module docstring)."""
    def best(names: list[str]) -> str:
        return max(names, key=lambda n: (figures[n]["failure_auroc"], n == "both"))

    meeting = [n for n in ALARM_RULES if figures[n]["false_alarm_ok"] and figures[n]["detection_ok"]]
    if meeting:
        chosen = best(meeting)
        return chosen, (f"highest failure AUROC ({figures[chosen]['failure_auroc']:.3f}) among the rules with false "
                        f"alarms <= alpha + {FALSE_ALARM_MARGIN} and detection >= {DETECTION_TARGET:.0%}: "
                        f"{', '.join(meeting)}")
    bounded = [n for n in ALARM_RULES if figures[n]["false_alarm_ok"]] or list(ALARM_RULES)
    chosen = best(bounded)
    return chosen, (f"no rule reached {DETECTION_TARGET:.0%} detection within the false-alarm bound; highest failure "
                    f"AUROC ({figures[chosen]['failure_auroc']:.3f}) among {', '.join(bounded)}")


def other_scorers(kept: str, embeddings: torch.Tensor, fit: NoveltyFit, embedding: EmbeddingSpec,
                  heldout: torch.Tensor, shifted: torch.Tensor, heldout_goals: Goals, shifted_goals: Goals,
                  alpha: float, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Every scorer kind fitted on the same split and scored offline, for the record ("measure both, keep one").

    Args:
        kept (`str`): The kind that serves (its figures here come from the same offline scores).
        embeddings (`torch.Tensor` of shape `[K, D]`): Calibration embeddings, in calibration order.
        fit (`NoveltyFit`): The kept fit (its split is reused).
        heldout (`torch.Tensor`), shifted (`torch.Tensor`): Embeddings of the evaluated goals.
        heldout_goals (`Goals`), shifted_goals (`Goals`): Their spread and failures (novelty is replaced).
    """
    out: dict[str, dict[str, Any]] = {}
    for kind in SCORER_KINDS:
        scorer = fit.scorer if kind == kept else fit_scorer(kind, embeddings[:fit.fit_count], embedding, seed=seed)
        calibration = [float(v) for v in scorer.scores(embeddings[fit.fit_count:])]
        threshold = conformal_threshold(calibration, alpha)
        held = [float(v) for v in scorer.scores(heldout)]
        shift = [float(v) for v in scorer.scores(shifted)]
        failed = list(heldout_goals.failed) + list(shifted_goals.failed)
        pooled = np.array(held + shift)
        mask = np.array(failed, dtype=bool)
        out[kind] = {
            "threshold": threshold,
            "false_alarm_rate": rate([v > threshold for v in held])["rate"],
            "detection_rate": rate([v > threshold for v in shift])["rate"],
            "auroc": auroc(held, shift),
            "failure_auroc": auroc(list(pooled[~mask]), list(pooled[mask])),
            "kept": kind == kept,
        }
    return out


def embed_frames(params: Any, images: Sequence[np.ndarray], grid: int | None = None) -> tuple[EmbeddingSpec,
                                                                                               torch.Tensor]:
    """Observation embeddings of recorded frames, as the node serving ``params`` computes them for its goals.

    The embedding reads the conditioning frame's latent only (``models/cosmos3/embedding.py``), so the model and the
    camera settings of ``params`` decide it; the instruction does not.

    Args:
        params (`NodeParams`): The node's parameters (model, device, dtype, domain, chunk, tier, view point, fps).
        images (`Sequence[np.ndarray]`): The frames, ``[H, W, 3]`` uint8 RGB, as the goals were served from.
        grid (`int`, *optional*): Pooling grid (default: the model's).
    """
    from ..catalog import load_pipeline
    from ..models.cosmos3 import DEFAULT_EMBEDDING_GRID, EMBEDDING_NAME, Cosmos3ActionModel, embedding_dim
    from ..serving.request_path import condition

    grid = grid or DEFAULT_EMBEDDING_GRID
    pipe, _ = load_pipeline(params.model, params.device, params.dtype, allow_pickle=params.allow_pickle_weights,
                         seed=params.seed)
    model = Cosmos3ActionModel(pipe)
    rows = [model.observation_embedding(prompt=params.instruction, action=condition(params, image), fps=params.fps,
                                        guidance_scale=params.guidance_scale, grid=grid) for image in images]
    spec = EmbeddingSpec(EMBEDDING_NAME, grid, embedding_dim(int(pipe.vae.config.z_dim), grid))
    return spec, torch.stack(rows)


def from_episodes(params: Any, spread: Sequence[float], images: Sequence[np.ndarray],
                  held_spread: Sequence[float], held_images: Sequence[np.ndarray], alpha: float, *,
                  scorer_path: Any, kind: str = DEFAULT_SCORER, fit_share: float = DEFAULT_FIT_SHARE,
                  seed: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``observation`` and ``combined`` sections from recorded successful episodes (``calibrate --bag``).

    The same fit and thresholds as the toy scenes (:func:`fit_thresholds`); the scorer is written to
    ``scorer_path``. Successful episodes hold neither shifted scenes nor failures, so only false alarms on the
    held-out goals are reported, and the recommended rule is FIPER's ``both`` (the rule that does not alarm on benign
    novelty alone); compare rules on failures of your own before choosing another.
    """
    embedding, embeddings = embed_frames(params, images)
    fit = fit_thresholds(spread, embeddings, embedding, alpha, kind=kind, fit_share=fit_share, seed=seed)
    digest = fit.scorer.save(scorer_path)
    held_novelty: list[float] = []
    if len(held_images):
        _, held_embeddings = embed_frames(params, held_images, embedding.grid)
        held_novelty = [float(v) for v in fit.scorer.scores(held_embeddings)]
    rules: dict[str, dict[str, Any]] = {}
    for name, rule in fit.rules.items():
        entry: dict[str, Any] = {"rule": name, "spread_threshold": rule.spread_threshold,
                                 "novelty_threshold": rule.novelty_threshold, "false_alarm_rate": None,
                                 "detection_rate": None, "failure_auroc": None}
        if held_novelty:
            alarms = rate([rule.decide(s, n)[0] for s, n in zip(held_spread, held_novelty)])
            entry.update(false_alarm_rate=alarms["rate"], false_alarms=alarms,
                         false_alarm_ok=alarms["rate"] <= alpha + FALSE_ALARM_MARGIN)
        rules[name] = entry
    novelty_rule = rules["novelty"]
    observation = {
        "threshold": fit.rules["novelty"].novelty_threshold, "alpha": alpha,
        "false_alarm_rate": novelty_rule["false_alarm_rate"], "detection_rate": None, "auroc": None,
        "scorer": kind, "scorer_file": str(scorer_path), "scorer_sha256": digest, "embedding": embedding.name,
        "embedding_grid": embedding.grid, "embedding_dim": embedding.dim, "fit_goals": fit.fit_count,
        "threshold_goals": fit.threshold_count,
    }
    chosen = rules["both"]
    combined = {
        "rule": "both", "false_alarm_rate": chosen["false_alarm_rate"], "detection_rate": None,
        "failure_auroc": None, "spread_threshold": chosen["spread_threshold"],
        "novelty_threshold": chosen["novelty_threshold"],
        "recommendation": "successful episodes hold no shifted scenes or failures to compare the rules on: FIPER's "
                          "both, which does not alarm on benign novelty alone",
        "rules": rules,
    }
    return observation, combined
