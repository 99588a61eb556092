"""``/diagnostics`` for the node, following diagnostic_updater's conventions (its Python package is not on PyPI).

Three statuses (``<node>: engine``, ``goals``, ``observations``), their keys and levels: docs/node.md, "Diagnostics".
:func:`build_diagnostics` is a pure function of a :class:`DiagnosticsInputs`, so levels and keys are unit-tested
without DDS.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from std_msgs.msg import Header

from ..novelty import NoveltyReport
from ..uncertainty import UncertaintyReport
from .conversions import format_value, metrics_key_values

OK = DiagnosticStatus.OK
WARN = DiagnosticStatus.WARN
ERROR = DiagnosticStatus.ERROR


@dataclass
class DiagnosticsInputs:
    """Everything the diagnostics report, gathered by the node.

    Args:
        node_name (`str`): Prefix of every status name.
        hardware_id (`str`): The device the model runs on (``cpu``, ``cuda:0``).
        model (`str`): The ``model`` parameter.
        notice (`str`): What the weights are (``"untrained demo weights"`` for ``tiny``).
        weights_version (`int`): Version now serving.
        engine_alive (`bool`): Whether the engine thread runs.
        groups_running (`int`), groups_queued (`int`): Groups inside the engine now (0 when idle: no stuck group).
        last_metrics (`Mapping[str, Any]`): Metrics of the last finished group (empty before the first).
        last_error (`str`, *optional*): ``"<CODE>: <message>"`` of the last goal, when it failed in the engine.
        goal_counts (`Mapping[str, int]`): :meth:`GoalTracker.snapshot`.
        observation_ages (`Mapping[str, float | None]`): Seconds since each topic's newest message (``None`` = never).
        max_observation_age_s (`float`): The staleness limit.
        frames_received (`int`): Good frames accepted.
        frames_rejected (`Mapping[str, int]`): Rejected frames per cause.
        image_topics (`tuple[str, ...]`): Which of ``observation_ages`` are image topics (the others are optional).
        clock_jumps (`Mapping[str, int]`, *optional*): ``backward`` / ``forward`` jumps of the simulated clock
            (``None`` off ``use_sim_time``).
        lifecycle_state (`str`): The managed node's state (``unconfigured``, ``inactive``, ``active``, ...).
        readiness (`str`): ``loading`` or ``warming up`` while configure runs; once configured ``ready``, or while
            active ``waiting for first frame on <topics>`` until each topic has delivered something.
        states_rejected (`int`): Joint states refused on arrival (ragged arrays).
        remote (`Mapping[str, Any]`, *optional*): ``engine: openpi``: the remote engine's state (``connected`` /
            ``reconnecting`` / ``unreachable``), last round trip, url, server, model and version; ``None`` = local.
        state_topic (`str`): Which of ``observation_ages`` is the joint state topic (``""``: none).
        state_names (`tuple[str, ...]`): The joints a model that takes state reads (empty: it takes none).
    """

    node_name: str
    hardware_id: str
    model: str
    notice: str
    weights_version: int
    engine_alive: bool
    groups_running: int = 0
    groups_queued: int = 0
    last_metrics: Mapping[str, Any] = field(default_factory=dict)
    last_error: str | None = None
    goal_counts: Mapping[str, int] = field(default_factory=dict)
    observation_ages: Mapping[str, float | None] = field(default_factory=dict)
    max_observation_age_s: float = 1.0
    frames_received: int = 0
    frames_rejected: Mapping[str, int] = field(default_factory=dict)
    image_topics: tuple[str, ...] = ()
    clock_jumps: Mapping[str, int] | None = None
    lifecycle_state: str = "active"
    readiness: str = "ready"
    states_rejected: int = 0
    remote: Mapping[str, Any] | None = None
    state_topic: str = ""
    state_names: tuple[str, ...] = ()


REMOTE_KEYS = ("state", "url", "round_trip_ms", "failures", "server", "model", "weights_version",
               "samples_per_request", "last_error")
"""What ``/diagnostics`` shows of a remote engine, each as ``remote_<key>``."""


def _kv(key: str, value: Any) -> KeyValue:
    return KeyValue(key=key, value=format_value(value))


def engine_status(inputs: DiagnosticsInputs) -> DiagnosticStatus:
    """The ``<node>: engine`` status."""
    values = [
        _kv("lifecycle_state", inputs.lifecycle_state),
        _kv("readiness", inputs.readiness),
        _kv("model", inputs.model),
        _kv("model_notice", inputs.notice),
        _kv("device", inputs.hardware_id),
        _kv("weights_version", inputs.weights_version),
        _kv("engine_alive", inputs.engine_alive),
        _kv("groups_running", inputs.groups_running),
        _kv("groups_queued", inputs.groups_queued),
    ]
    remote = inputs.remote
    if remote is not None:
        values += [_kv(f"remote_{key}", remote.get(key)) for key in REMOTE_KEYS]
    values += metrics_key_values({k: v for k, v in inputs.last_metrics.items() if k != "weights_version"})
    if inputs.lifecycle_state != "active":
        doing = inputs.readiness if inputs.readiness != "ready" else (
            "ready, not serving" if inputs.lifecycle_state == "inactive" else "not serving")
        level, message = OK, f"{inputs.lifecycle_state}: {doing} ({inputs.notice})"
    elif not inputs.engine_alive:
        level, message = ERROR, f"engine stopped ({inputs.notice})"
    elif remote is not None and remote.get("state") != "connected":
        level, message = ERROR, f"remote engine {remote.get('state')}: {remote.get('url')} ({inputs.notice})"
    elif inputs.readiness != "ready":
        # Not a fault: a camera that has not published yet is what a node just started sees.
        level, message = OK, f"active: {inputs.readiness} ({inputs.notice})"
    elif inputs.last_error:
        level, message = WARN, f"last goal failed: {inputs.last_error} ({inputs.notice})"
        values.append(_kv("last_error", inputs.last_error))
    elif bool(UncertaintyReport.from_metrics(inputs.last_metrics).uncertain):
        # Not a failure: the trajectory was published. The caller decides what uncertainty means for the task.
        level = WARN
        message = f"last goal uncertain: {uncertain_reason(inputs.last_metrics)} ({inputs.notice})"
    else:
        level, message = OK, f"serving ({inputs.notice})"
    return DiagnosticStatus(level=level, name=f"{inputs.node_name}: engine", message=message,
                            hardware_id=inputs.hardware_id, values=values)


def uncertain_reason(metrics: Mapping[str, Any]) -> str:
    """Why a goal is ``uncertain``, in the words of its rule: the scores against their thresholds (window means when
    the node aggregates over a window)."""
    report = UncertaintyReport.from_metrics(metrics)
    novelty = report.novelty or NoveltyReport()
    window = report.window
    suffix = f" (mean of {window} goals)" if isinstance(window, int) and window > 1 else ""

    def value(own: float | None, mean: float | None) -> float:
        return float((own if mean is None else mean) or 0.0)

    spread = (f"score {value(report.score, report.score_window):.4g} vs threshold "
              f"{float(report.threshold or 0):.4g}")
    rule = str(report.rule or "")
    if not rule:  # no novelty scorer: today's message
        return f"score {float(report.score or 0):.4g} > threshold {float(report.threshold or 0):.4g}"
    seen = (f"novelty {value(novelty.score, novelty.score_window):.4g} vs threshold "
            f"{float(novelty.threshold or 0):.4g}")
    parts = {"spread": spread, "novelty": seen}.get(rule, f"{spread}, {seen}")
    return f"rule {rule}: {parts}{suffix}"


def goals_status(inputs: DiagnosticsInputs) -> DiagnosticStatus:
    """The ``<node>: goals`` status: ``goals_<outcome>`` counters and the running / waiting gauges."""
    counts = dict(inputs.goal_counts)
    values = [_kv(f"goals_{name}", count) for name, count in counts.items() if name not in ("running", "waiting")]
    values += [_kv("goals_running", counts.get("running", 0)), _kv("goals_waiting", counts.get("waiting", 0))]
    message = ", ".join(f"{counts.get(k, 0)} {k}" for k in ("succeeded", "aborted", "canceled", "preempted",
                                                             "rejected"))
    return DiagnosticStatus(level=OK, name=f"{inputs.node_name}: goals", message=message,
                            hardware_id=inputs.hardware_id, values=values)


def observations_status(inputs: DiagnosticsInputs) -> DiagnosticStatus:
    """The ``<node>: observations`` status; WARN while an image topic is silent or stale."""
    values: list[KeyValue] = []
    problems: list[str] = []
    image_ages = []
    for topic, age in inputs.observation_ages.items():
        values.append(_kv(f"age_s {topic}", "never" if age is None else age))
        if topic == inputs.state_topic and inputs.state_names:
            # A model that takes state is as blind without it as without a camera.
            if age is None:
                problems.append(f"no joint state yet on {topic}")
            elif age > inputs.max_observation_age_s:
                problems.append(f"{topic} stale ({age:.2f} s)")
        if topic not in inputs.image_topics:
            continue
        image_ages.append(age)
        if age is None:
            problems.append(f"no image yet on {topic}")
        elif age > inputs.max_observation_age_s:
            problems.append(f"{topic} stale ({age:.2f} s)")
    known = [a for a in image_ages if a is not None]
    # The observation is as old as its oldest part (see ObservationBuffer.latest).
    values.insert(0, _kv("observation_age_s", max(known) if known and len(known) == len(image_ages) else "never"))
    if inputs.state_topic in inputs.observation_ages:
        state_age = inputs.observation_ages[inputs.state_topic]
        values.insert(1, _kv("state_age_s", "never" if state_age is None else state_age))
    if inputs.state_names:
        values.insert(2, _kv("state_names", ", ".join(inputs.state_names)))
    values.append(_kv("max_observation_age_s", inputs.max_observation_age_s))
    values.append(_kv("frames_received", inputs.frames_received))
    if inputs.clock_jumps is not None:
        values += [_kv(f"clock_jumps_{way}", inputs.clock_jumps.get(way, 0)) for way in ("backward", "forward")]
    values += [_kv(f"frames_rejected_{cause}", count) for cause, count in inputs.frames_rejected.items()]
    values.append(_kv("states_rejected", inputs.states_rejected))
    rejected = sum(inputs.frames_rejected.values())
    message = "; ".join(problems) if problems else "observations fresh"
    if rejected:
        message += f"; {rejected} frame(s) rejected"
    if inputs.states_rejected:
        message += f"; {inputs.states_rejected} joint state(s) rejected"
    return DiagnosticStatus(level=WARN if problems else OK, name=f"{inputs.node_name}: observations",
                            message=message, hardware_id=inputs.hardware_id, values=values)


def build_diagnostics(inputs: DiagnosticsInputs, stamp: Time) -> DiagnosticArray:
    """The node's ``DiagnosticArray``.

    Args:
        inputs (`DiagnosticsInputs`): The node's state.
        stamp (`builtin_interfaces.msg.Time`): Now, on the node's clock.
    """
    return DiagnosticArray(
        header=Header(stamp=stamp),
        status=[engine_status(inputs), goals_status(inputs), observations_status(inputs)],
    )
