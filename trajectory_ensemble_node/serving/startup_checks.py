"""Misconfigurations the node reports loudly instead of running on silently (issue 20).

Duplicate node names, params files without a section for this node, toy settings, raw-space reducers without action
statistics; why each is a warning or a refusal: docs/node.md, "Misconfigurations reported at start". No rclpy at
module level.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from ..bundled import default_stats, settings_mismatch
from ..errors import NoveltyScorerError, ParameterError
from ..normalization import ActionNormalizer
from ..reducers import available_reducers, get_reducer
from ..uncertainty import NoveltyCheck, load_calibration


def count_same_name(names_and_namespaces: Iterable[tuple[str, str]], name: str, namespace: str) -> int:
    """How many nodes on the graph have this node's fully qualified name (itself included).

    Args:
        names_and_namespaces (`Iterable[tuple[str, str]]`): ``Node.get_node_names_and_namespaces()``.
        name (`str`), namespace (`str`): This node's.
    """
    return sum(1 for n, ns in names_and_namespaces if n == name and ns == namespace)


def params_files_from_args(args: Sequence[str]) -> list[str]:
    """The ``--params-file`` paths in a ROS command line (only those after ``--ros-args``).

    Args:
        args (`Sequence[str]`): The node's argv.
    """
    files: list[str] = []
    in_ros = False
    for i, arg in enumerate(args):
        if arg == "--ros-args":
            in_ros = True
        elif arg == "--":
            in_ros = False
        elif in_ros and arg == "--params-file" and i + 1 < len(args):
            files.append(args[i + 1])
    return files


def raw_reducer_without_stats(reducer: str, action_stats_file: str) -> str | None:
    """The warning for a raw-space reducer that will run on normalized actions, or ``None``.

    Args:
        reducer (`str`): A reducer name.
        action_stats_file (`str`): The ``action_stats_file`` parameter.
    """
    if action_stats_file or reducer not in available_reducers() or get_reducer(reducer).space != "raw":
        return None
    return (f"reducer {reducer!r} needs physical units (it reduces in raw space) but action_stats_file is not set: "
            f"it runs on normalized actions and its result is not a {reducer} mean in any physical sense; set "
            f"action_stats_file, or use a normalized-space reducer")


bundled_settings_mismatch = settings_mismatch
"""For a bundled policy (``model: toy`` or ``pusht``), the action settings that differ from the ones it was trained
with, in words (:func:`~trajectory_ensemble_node.bundled.settings_mismatch`, re-exported where the startup checks
live)."""


def load_action_stats(params: Any) -> ActionNormalizer | None:
    """The ``action_stats_file`` normalizer, or the bundled policy's own statistics when the file is unset
    (:func:`~trajectory_ensemble_node.bundled.default_stats`), else ``None``; a file keyed by domain is read at this
    domain.

    Raises:
        StatsFileError: the file is unusable.
    """
    path, method = params.action_stats_file, params.action_stats_method
    if not path:
        # A bundled policy that acts in physical units carries its statistics and their method.
        path, method = default_stats(params) or ("", method)
    if not path:
        return None
    domain = None
    try:
        with open(path, encoding="utf-8") as handle:
            if params.domain_name in json.load(handle):
                domain = params.domain_name
    except (OSError, ValueError):
        pass  # from_json reports the file's problem by name
    return ActionNormalizer.from_json(path, method, params.action_dim, domain=domain)


_THRESHOLD_KEYS = ("threshold", "spread_threshold", "novelty_threshold")


def _refuse_constant(token: str) -> float:
    raise ValueError(f"non-finite number {token} (a threshold or score that is NaN or infinite never fires)")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(f"number {token} overflows to {value!r} (a threshold or score that is infinite never fires)")
    return value


def read_calibration_file(path: str) -> dict[str, Any]:
    """A ``calibrate`` JSON, checked for meaning as well as shape: every number in it finite, every ``alpha`` in
    (0, 1), every threshold >= 0.

    A NaN threshold compares as "not above" with every score, and an infinite one is never exceeded: either makes
    an alarm that cannot fire, which a node must refuse at start-up rather than serve silently.

    Args:
        path (`str`): The ``uncertainty_calibration_file`` parameter.

    Returns:
        `dict[str, Any]`: The parsed document.

    Raises:
        ParameterError: unreadable, not a JSON object, a NaN/Infinity anywhere, an ``alpha`` outside (0, 1) or a
            negative threshold (the key path and value quoted).
    """
    def refuse(why: str) -> ParameterError:
        return ParameterError(f"invalid parameters:\n  uncertainty_calibration_file: {path!r} {why}")

    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle, parse_constant=_refuse_constant, parse_float=_finite_float)
    except (OSError, ValueError) as error:
        raise refuse(f"cannot be used ({type(error).__name__}: {error})") from None
    if not isinstance(document, dict):
        raise refuse(f"is not a JSON object (got {type(document).__name__})")
    pending: list[tuple[str, Any]] = [("", document)]
    while pending:
        where, node = pending.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            here = f"{where}.{key}" if where else str(key)
            if isinstance(value, (dict, list)):
                pending.append((here, value))
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            elif key == "alpha" and not 0 < value < 1:
                raise refuse(f"has {here} = {value!r}; an alpha outside (0, 1) calibrates no threshold")
            elif key in _THRESHOLD_KEYS and value < 0:
                raise refuse(f"has {here} = {value!r}; thresholds are >= 0")
    return document


def load_uncertainty_threshold(params: Any) -> float | None:
    """``uncertainty_threshold``, or ``uncertainty.threshold`` of ``uncertainty_calibration_file``; ``None`` = none.

    Raises:
        ParameterError: the calibration file is unreadable, holds a non-finite number or an alpha outside (0, 1)
            anywhere (:func:`read_calibration_file`), or holds no finite, non-negative threshold.
    """
    path = params.uncertainty_calibration_file
    if not path:
        return params.uncertainty_threshold or None
    document = read_calibration_file(path)
    try:
        value = document["uncertainty"]["threshold"]
    except (KeyError, TypeError) as error:
        raise ParameterError(
            f"invalid parameters:\n  uncertainty_calibration_file: {path!r} is not a trajectory-ensemble calibrate "
            f"JSON with uncertainty.threshold ({type(error).__name__}: {error})"
        ) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ParameterError(f"invalid parameters:\n  uncertainty_calibration_file: {path!r} has threshold "
                             f"{value!r}; expected a finite number >= 0")
    return float(value)


def load_novelty(params: Any) -> NoveltyCheck | None:
    """The novelty scorer and its calibrated rule (``novelty_scorer_file`` with ``uncertainty_calibration_file`` and
    ``uncertainty_rule``); ``None`` without a scorer.

    Raises:
        ParameterError: the calibration file holds no novelty calibration for the rule, or a value that cannot fire
            (:func:`read_calibration_file`).
        NoveltyScorerError: the scorer is unreadable, or not the one the calibration file was written with.
    """
    if not params.novelty_scorer_file:
        return None
    if params.uncertainty_calibration_file:
        read_calibration_file(params.uncertainty_calibration_file)
    try:
        return load_calibration(params.uncertainty_calibration_file, params.novelty_scorer_file,
                                params.uncertainty_rule)
    except NoveltyScorerError:
        raise
    except ValueError as error:
        raise ParameterError(f"invalid parameters:\n  uncertainty_calibration_file: {error}") from None
