"""The alarm over a short window of one episode's goals (FIPER aggregates its scores over a few steps).

With ``uncertainty_window`` W > 1, ``uncertain`` and ``novel`` are decided on the means of the episode's last W goals
by the same :class:`~trajectory_ensemble_node.uncertainty.AlarmRule`; a goal that starts fresh starts a new window,
and W = 1 changes nothing (docs/safety-and-uncertainty.md). ROS-free.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import MutableMapping
from typing import Any

from ..uncertainty import AlarmRule, UncertaintyReport


class UncertaintyWindow:
    """The last ``size`` goals' scores of the current episode, and the alarm decided on their means.

    Args:
        size (`int`): W, goals per window (>= 1).
        alarm (`AlarmRule`, *optional*): The rule and thresholds in force; ``None``: no threshold is configured, so
            only the window means are reported.

    Raises:
        ValueError: ``size`` < 1.
    """

    def __init__(self, size: int, alarm: AlarmRule | None) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"uncertainty window must be an int >= 1, got {size!r}")
        self.size = size
        self.alarm = alarm
        self._scores: deque[tuple[float, float | None]] = deque(maxlen=size)
        self._lock = threading.Lock()

    def observe(self, metrics: MutableMapping[str, Any], continued: bool) -> None:
        """Add a succeeded goal's scores; with W > 1, set the window entries and the alarm on its metrics.

        Args:
            metrics (`MutableMapping[str, Any]`): The goal's metrics (``uncertainty_score``, ``novelty_score``);
                updated in place with ``uncertainty_window``, ``uncertainty_score_window``,
                ``novelty_score_window``, and ``uncertain`` / ``novel`` decided on the means.
            continued (`bool`): Whether the goal continued the previous chunk; False starts a new window.
        """
        report = UncertaintyReport.from_metrics(metrics)
        spread = report.score
        if not isinstance(spread, (int, float)) or isinstance(spread, bool):
            return  # no candidates were scored (nothing to aggregate)
        novelty = report.novelty_score
        novelty = float(novelty) if isinstance(novelty, (int, float)) and not isinstance(novelty, bool) else None
        with self._lock:
            if not continued:
                self._scores.clear()
            self._scores.append((float(spread), novelty))
            window = list(self._scores)
        if self.size == 1:
            return
        mean_spread = sum(s for s, _ in window) / len(window)
        novelties = [n for _, n in window if n is not None]
        mean_novelty = sum(novelties) / len(novelties) if len(novelties) == len(window) else None
        metrics["uncertainty_window"] = len(window)
        metrics["uncertainty_score_window"] = mean_spread
        if mean_novelty is not None:
            metrics["novelty_score_window"] = mean_novelty
        if self.alarm is None or (mean_novelty is None and self.alarm.rule != "spread"):
            return
        uncertain, novel = self.alarm.decide(mean_spread, mean_novelty)
        metrics["uncertain"] = uncertain
        if novel is not None:
            metrics["novel"] = novel

    def reset(self) -> None:
        """Forget the episode (the next goal starts a new window whatever it continues)."""
        with self._lock:
            self._scores.clear()
