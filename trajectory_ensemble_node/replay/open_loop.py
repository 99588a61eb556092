"""Open-loop evaluation: served chunks against the recorded actions, in the recording's own units.

:func:`match_channels`, :func:`compare_goal` (row ``k`` at ``stamp + (k + 1) dt``), :func:`summarize` (RMSE overall,
per channel, per horizon step, ``served_rank``) and :func:`check_gate`; what each means: docs/replay-tests.md. Plain
numpy; no rclpy, no matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import TrajectoryEnsembleError
from .reference import ReferenceError, ReferenceSeries

SKIP = "-"
"""A ``--reference-channels`` entry that leaves that served channel out of the comparison."""


class GateLimitError(TrajectoryEnsembleError, ValueError):
    """A ``--max-rmse`` or ``--max-rmse-channel`` limit is malformed or names no compared channel; the message
    quotes it."""


@dataclass(frozen=True)
class ChannelMap:
    """Which served column is compared with which recorded channel.

    Args:
        names (`tuple[str, ...]`): Name of each compared channel (the recording's joint name where it has one).
        served (`tuple[int, ...]`): Served action column of each.
        reference (`tuple[int, ...]`): Channel of the :class:`~.reference.ReferenceSeries` of each.
        matched_by (`str`): ``--reference-channels``, ``joint_names`` or ``index``.
    """

    names: tuple[str, ...]
    served: tuple[int, ...]
    reference: tuple[int, ...]
    matched_by: str


def _default_names(width: int) -> list[str]:
    from .plots import channel_names

    return channel_names(width)


def match_channels(reference: ReferenceSeries, served_width: int, served_names: Sequence[str] | None = None,
                   selectors: Sequence[str] | None = None) -> ChannelMap:
    """Pair the served action channels with recorded ones (rules in docs/replay-tests.md).

    Args:
        reference (`ReferenceSeries`): The recording.
        served_width (`int`): ``action_dim`` of the served chunks.
        served_names (`Sequence[str]`, *optional*): The node's ``joint_names``, one per action channel.
        selectors (`Sequence[str]`, *optional*): ``--reference-channels``: per served channel, a recorded joint
            name, a recorded channel index, or :data:`SKIP`.

    Raises:
        ReferenceError: A width mismatch, a name or index the recording lacks, or nothing left to compare.
    """
    served_names = [n for n in (served_names or []) if n] or None
    if served_names is not None and len(served_names) != served_width:
        served_names = None  # the node's names do not describe these chunks; fall back to the other rules
    topic = reference.describe()
    if selectors:
        if len(selectors) != served_width:
            raise ReferenceError(f"--reference-channels gives {len(selectors)} entries {list(selectors)} for "
                                 f"{served_width} served action channels (one each; '{SKIP}' leaves one out)")
        pairs = []
        for i, selector in enumerate(selectors):
            if selector == SKIP:
                continue
            if reference.names is not None and selector in reference.names:
                pairs.append((i, reference.names.index(selector)))
            elif selector.isdigit() and int(selector) < reference.width:
                pairs.append((i, int(selector)))
            else:
                raise ReferenceError(f"--reference-channels entry {i} {selector!r}: no such channel in {topic}")
        if not pairs:
            raise ReferenceError(f"--reference-channels {list(selectors)} leaves no channel to compare")
        matched_by = "--reference-channels"
    elif served_names is not None and reference.names is not None:
        missing = [n for n in served_names if n not in reference.names]
        if missing:
            raise ReferenceError(f"served channel {missing[0]!r} (the node's joint_names {served_names}) is not "
                                 f"recorded on {topic}; map the channels with --reference-channels")
        pairs = [(i, reference.names.index(n)) for i, n in enumerate(served_names)]
        matched_by = "joint_names"
    else:
        if reference.width != served_width:
            raise ReferenceError(f"width mismatch: the served chunks have {served_width} action channels, {topic} "
                                 f"has {reference.width}; choose one recorded channel per served channel with "
                                 "--reference-channels")
        pairs = [(i, i) for i in range(served_width)]
        matched_by = "index"
    fallback = list(served_names) if served_names is not None else _default_names(served_width)
    names = tuple(reference.names[r] if reference.names is not None else fallback[s] for s, r in pairs)
    if len(set(names)) != len(names):
        names = tuple(f"{name}[{s}]" for name, (s, _) in zip(names, pairs))
    return ChannelMap(names, tuple(s for s, _ in pairs), tuple(r for _, r in pairs), matched_by)


def row_times_ns(stamp_ns: int, dt: float, horizon: int) -> np.ndarray:
    """``[horizon]`` int64: ``stamp_ns + round((k + 1) * dt * 1e9)``, where the node publishes row ``k``."""
    return int(stamp_ns) + np.rint((np.arange(horizon) + 1) * float(dt) * 1e9).astype(np.int64)


def _rms(values: np.ndarray) -> float | None:
    values = np.asarray(values, dtype=np.float64)
    return float(np.sqrt(np.mean(values * values))) if values.size else None


@dataclass
class GoalComparison:
    """One served chunk against the recording.

    Args:
        index (`int`): 1-based goal number.
        stamp_ns (`int`): Observation stamp of the chunk.
        times_ns (`np.ndarray` of shape `[H]`): Where each row stands.
        compared (`np.ndarray` of shape `[H]`, bool): Rows inside the recording.
        past (`np.ndarray` of shape `[H]`, bool), before (`np.ndarray` of shape `[H]`, bool): Rows after its end,
            before its start.
        served (`np.ndarray` of shape `[H, C]`): The served rows of the compared channels.
        recorded (`np.ndarray` of shape `[H, C]`): The recording at the row times (NaN where not compared).
        candidates (`np.ndarray` of shape `[N, H, C]`, *optional*): The candidates' rows, when returned.
        dt (`float`): Seconds between rows.
    """

    index: int
    stamp_ns: int
    times_ns: np.ndarray
    compared: np.ndarray
    past: np.ndarray
    before: np.ndarray
    served: np.ndarray
    recorded: np.ndarray
    candidates: np.ndarray | None = None
    dt: float = 0.0

    @property
    def errors(self) -> np.ndarray:
        """``[rows compared, C]``: served minus recorded."""
        return (self.served - self.recorded)[self.compared]

    def candidate_rmse(self) -> list[float | None]:
        """RMSE of each candidate over the compared rows (``None`` for a dropped, non-finite candidate)."""
        if self.candidates is None:
            return []
        out: list[float | None] = []
        for candidate in self.candidates:
            err = (candidate - self.recorded)[self.compared]
            out.append(_rms(err) if np.all(np.isfinite(err)) else None)
        return out


def compare_goal(index: int, stamp_ns: int, dt: float, trajectory: np.ndarray, candidates: np.ndarray | None,
                 reference: ReferenceSeries, channels: ChannelMap) -> GoalComparison:
    """Align one served chunk with the recording (docs/replay-tests.md, "What is compared with what").

    Args:
        index (`int`): 1-based goal number.
        stamp_ns (`int`): The chunk's header stamp (its observation's).
        dt (`float`): Seconds between rows, as published (the message's float32 ``dt``).
        trajectory (`np.ndarray` of shape `[H, D]`): The served chunk.
        candidates (`np.ndarray` of shape `[N, H, D]`, *optional*): Its candidates.
        reference (`ReferenceSeries`), channels (`ChannelMap`): The recording and the channel pairing.
    """
    trajectory = np.asarray(trajectory, dtype=np.float64)
    horizon = trajectory.shape[0]
    times = row_times_ns(stamp_ns, dt, horizon)
    first, last = reference.span_ns(channels.reference)
    compared = (times >= first) & (times <= last)
    recorded = np.full((horizon, len(channels.served)), np.nan)
    if compared.any():
        recorded[compared] = reference.sample(channels.reference, times[compared])
    served = trajectory[:, list(channels.served)]
    cands = None if candidates is None else np.asarray(candidates, dtype=np.float64)[:, :, list(channels.served)]
    return GoalComparison(index, int(stamp_ns), times, compared, times > last, times < first, served, recorded, cands,
                          float(dt))


def _per_step(errors_by_goal: Sequence[tuple[np.ndarray, np.ndarray]], horizon: int) -> list[float | None]:
    """RMSE at each horizon step over the goals whose row there was compared: ``(compared [H], err [H, C])``."""
    out: list[float | None] = []
    for k in range(horizon):
        rows = [err[k] for compared, err in errors_by_goal if k < len(compared) and compared[k]]
        out.append(_rms(np.concatenate(rows)) if rows else None)
    return out


def _by_name(names: Sequence[str], values: Sequence[float | None]) -> dict[str, float | None]:
    return dict(zip(names, values))


def summarize(goals: Sequence[GoalComparison], reference: ReferenceSeries, channels: ChannelMap,
              served_normalized: bool = False) -> dict[str, object]:
    """The ``reference`` section of ``summary.json`` (keys in docs/replay-tests.md).

    Raises:
        ReferenceError: No served row falls inside the recording (no overlap in time); the message gives both
            time ranges.
    """
    if goals and not any(g.compared.any() for g in goals):
        first, last = reference.span_ns(channels.reference)
        served_first = min(int(g.times_ns[0]) for g in goals)
        served_last = max(int(g.times_ns[-1]) for g in goals)
        raise ReferenceError(
            f"no time overlap: the served rows stand at {served_first / 1e9:.3f} .. {served_last / 1e9:.3f} s, "
            f"{reference.topic} is recorded at {first / 1e9:.3f} .. {last / 1e9:.3f} s (JointState, "
            "JointTrajectory and ActionTrajectory are timed by header stamps, the arrays by log time)")
    names = channels.names
    horizon = max((len(g.times_ns) for g in goals), default=0)
    errors = np.concatenate([g.errors for g in goals], axis=0) if goals else np.zeros((0, len(names)))
    per_goal = []
    ranks, best_rows = [], []
    for g in goals:
        # NaN on rows left out; _per_step reads compared rows only.
        err = g.served - g.recorded
        entry: dict[str, object] = {
            "index": g.index, "stamp_ns": g.stamp_ns, "rows_compared": int(g.compared.sum()),
            "rows_past_recording": int(g.past.sum()), "rows_before_recording": int(g.before.sum()),
            "rmse": _rms(g.errors),
            "rmse_per_channel": _by_name(names, [_rms(g.errors[:, c]) for c in range(len(names))]),
            "mae_per_channel": _by_name(names, [float(np.mean(np.abs(g.errors[:, c]))) if len(g.errors) else None
                                                for c in range(len(names))]),
            "error_by_step": _per_step([(g.compared, err)], len(g.times_ns)),
        }
        if g.candidates is not None and g.compared.any():
            scores = g.candidate_rmse()
            finite = [(s, i) for i, s in enumerate(scores) if s is not None]
            entry["candidate_rmse"] = scores
            if finite:
                best, best_index = min(finite)
                served_rmse = float(entry["rmse"])  # type: ignore[arg-type]
                entry["best_candidate"] = best_index
                entry["best_candidate_rmse"] = best
                entry["served_rank"] = 1 + sum(s < served_rmse for s, _ in finite)
                ranks.append(entry["served_rank"])
                best_rows.append((g.compared, g.candidates[best_index] - g.recorded))
        per_goal.append(entry)
    step_input = [(g.compared, g.served - g.recorded) for g in goals]
    first, last = reference.span_ns(channels.reference)
    section: dict[str, object] = {
        "topic": reference.topic,
        "msgtype": reference.msgtype,
        "channels": list(names),
        "matched_by": channels.matched_by,
        "channel_map": [{"name": n, "served_index": s,
                         "reference": reference.names[r] if reference.names is not None else r}
                        for n, s, r in zip(names, channels.served, channels.reference)],
        "recorded_s": [first / 1e9, last / 1e9],
        "served_normalized": bool(served_normalized),
        "goals_compared": sum(bool(g.compared.any()) for g in goals),
        "rows_compared": int(sum(g.compared.sum() for g in goals)),
        "rows_past_recording": int(sum(g.past.sum() for g in goals)),
        "rows_before_recording": int(sum(g.before.sum() for g in goals)),
        "rmse": _rms(errors),
        "rmse_per_channel": _by_name(names, [_rms(errors[:, c]) for c in range(len(names))]),
        "mae_per_channel": _by_name(names, [float(np.mean(np.abs(errors[:, c]))) if len(errors) else None
                                            for c in range(len(names))]),
        "error_by_step": _per_step(step_input, horizon),
        "error_by_step_per_channel": _by_name(names, [_per_step([(c_, e[:, [c]]) for c_, e in step_input], horizon)
                                                      for c in range(len(names))]),
        "rows_by_step": [int(sum(bool(k < len(g.compared) and g.compared[k]) for g in goals))
                         for k in range(horizon)],
        "dt": goals[0].dt if goals else None,
        "goals": per_goal,
    }
    if best_rows:
        section["best_candidate_rmse"] = _rms(np.concatenate([err[compared] for compared, err in best_rows]))
        section["best_candidate_error_by_step"] = _per_step(best_rows, horizon)
        section["served_rank_mean"] = float(np.mean(ranks))
    return section


def parse_channel_limit(text: str) -> tuple[str, float]:
    """``NAME=VALUE`` of ``--max-rmse-channel`` as ``(name, value)``.

    Raises:
        GateLimitError: Not ``NAME=VALUE`` with a finite ``VALUE >= 0``; the message quotes the text.
    """
    name, sep, value = text.rpartition("=")
    try:
        limit = float(value)
    except ValueError:
        limit = math.nan
    if not sep or not name or not math.isfinite(limit) or limit < 0:
        raise GateLimitError(f"--max-rmse-channel expects NAME=VALUE with a number VALUE >= 0, got {text!r}")
    return name, limit


def check_limit_names(channel_names: Sequence[str], limits: Mapping[str, float]) -> None:
    """Refuse a ``--max-rmse-channel`` name that is not a compared channel.

    Raises:
        GateLimitError: The message names the limit and the compared channels.
    """
    for name in limits:
        if name not in channel_names:
            raise GateLimitError(f"--max-rmse-channel {name}={limits[name]:g}: no compared channel {name!r} "
                                 f"(channels: {list(channel_names)})")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _worst_goal(section: Mapping[str, object], channel: str | None) -> str:
    best: tuple[float, int] | None = None
    for goal in section["goals"]:  # type: ignore[union-attr]
        value = goal["rmse"] if channel is None else goal["rmse_per_channel"].get(channel)
        if value is not None and (best is None or value > best[0]):
            best = (float(value), int(goal["index"]))
    return "no goal compared" if best is None else f"worst goal {best[1]}: {best[0]:.4f}"


def check_gate(section: Mapping[str, object], max_rmse: float | None = None,
               max_rmse_channel: Mapping[str, float] | None = None) -> tuple[list[str], list[str]]:
    """Compare the run's RMSE with the limits: ``(failures, passes)``, one line each.

    A failure line names the channel (the worst one for ``--max-rmse``), the value, the limit and the goal with the
    largest error on it.

    Raises:
        GateLimitError: A per-channel limit names no compared channel.
    """
    limits = dict(max_rmse_channel or {})
    names = list(section["channels"])  # type: ignore[call-overload]
    check_limit_names(names, limits)
    failures, passes = [], []
    per_channel: Mapping[str, float | None] = section["rmse_per_channel"]  # type: ignore[assignment]
    if max_rmse is not None:
        value: float | None = section["rmse"]  # type: ignore[assignment]
        worst = max(((v, n) for n, v in per_channel.items() if v is not None), default=(math.nan, "-"))
        line = (f"rmse {_fmt(value)} over channels {', '.join(names)} (worst channel {worst[1]}: "
                f"{worst[0]:.4f}; {_worst_goal(section, None)})")
        if value is None or value > max_rmse:
            failures.append(f"gate: {line} exceeds --max-rmse {max_rmse:g}")
        else:
            passes.append(f"gate: {line} within --max-rmse {max_rmse:g}")
    for name, limit in limits.items():
        value = per_channel.get(name)
        line = f"channel {name} rmse {_fmt(value)} ({_worst_goal(section, name)})"
        if value is None or value > limit:
            failures.append(f"gate: {line} exceeds --max-rmse-channel {name}={limit:g}")
        else:
            passes.append(f"gate: {line} within --max-rmse-channel {name}={limit:g}")
    return failures, passes
