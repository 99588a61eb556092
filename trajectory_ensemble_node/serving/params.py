"""Every parameter of the node: name, type, default, description, and the checks that run at startup.

:data:`PARAMETERS` is the one list the node, ``serve-openpi``, ``config/serve.yaml`` and the docs are checked against;
:func:`validate` is pure (a mapping in, :class:`NodeParams` out). Numeric parameters are declared with dynamic typing
and converted here, so ``fps: 15`` in a YAML file is read as 15.0; what cannot be converted is reported by name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..contract import check_count, check_reducer, check_request
from ..engine.context import GUIDANCE_MODES
from ..errors import InvalidSpecError, ParameterError
from ..models.cosmos3 import CFG_MODES, RESOLUTION_TIERS, STEP_CAPTURE_MODES, VIEW_POINTS, embodiment_widths
from ..normalization import NORMALIZATION_METHODS
from ..reducers import check_mode_threshold
from ..uncertainty import ALARM_RULES
from .param_faults import FAULTS, TESTING_ENV, check_fault_injection, parse_fault  # noqa: F401 - importable here
from .param_values import INT64_RANGE, coerce, preview  # noqa: F401 - INT64_RANGE is importable from here too
from .remote_params import ENGINES, check_engine

_WIDTHS = embodiment_widths()

GOAL_POLICIES = ("preempt", "queue", "reject")
DTYPE_NAMES = ("float32", "bfloat16", "float16")
POSITION_LIMIT_POLICIES = ("drop", "clamp")


@dataclass(frozen=True)
class ParamSpec:
    """One declared parameter.

    Args:
        name (`str`): Parameter name.
        default (`Any`): Default value; its Python type is the parameter's type (``[""]`` = an unset string list).
        description (`str`): What it does (shown by ``ros2 param describe``).
        constraints (`str`): Allowed values, in words.
        read_only (`bool`): False only for parameters that may change while the node runs.
    """

    name: str
    default: Any
    description: str
    constraints: str = ""
    read_only: bool = True


PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("model", "toy", "toy (bundled toy policy, the default), pusht (bundled PushT policy), tiny (embedded "
              "random model) or a local Cosmos 3 diffusers directory", "tiny, toy, pusht or an existing directory"),
    ParamSpec("device", "auto", "torch device", "auto, cpu, cuda or cuda:N"),
    ParamSpec("dtype", "float32", "transformer compute dtype", ", ".join(DTYPE_NAMES)),
    ParamSpec("seed", 0, "seed of the random weights of model: tiny", ">= 0"),
    ParamSpec("instruction", "move the blue robot to the green target without touching the red obstacle", "instruction used when a goal and ~/instruction leave it empty"),
    ParamSpec("domain_name", "pusht", "embodiment the model is conditioned on; sets the action width",
              "a Cosmos 3 domain with a fixed action width"),
    ParamSpec("chunk_size", 8, "actions per trajectory", ">= 1"),
    ParamSpec("resolution_tier", 256, "conditioning resolution tier", "256, 480, 704 or 720"),
    ParamSpec("view_point", "ego_view", "camera view point the model is told about (concat_view for tiled cameras)",
              ", ".join(VIEW_POINTS)),
    ParamSpec("fps", 8.0, "frame rate of the action chunk; dt = 1 / fps", "> 0"),
    ParamSpec("num_inference_steps", 10, "denoising steps per trajectory", ">= 1"),
    ParamSpec("guidance_scale", 1.0, "classifier-free guidance scale; 1.0 disables the unconditional branch", "> 0"),
    ParamSpec("candidate_count", 8, "candidates per goal when the goal says 0", "1 .. max_candidates"),
    ParamSpec("reducer", "mode", "reducer when the goal leaves it empty", "a reducer valid for the action space"),
    ParamSpec("mode_threshold", 0.0, "fixed cut of mode and mode_continuity: RMS distance in normalized action "
              "units (trajectory-ensemble calibrate --bag recommends one); 0 = the relative rule (2x the group's "
              "median k-th nearest-neighbour distance), or a bundled policy's own cut; engine: openpi applies it where "
              "the node reduces (a server drawing one sample per request), a server reducing whole groups its own",
              ">= 0, finite"),
    ParamSpec("max_candidates", 32, "goals asking for more candidates are aborted before any model work", ">= 1"),
    ParamSpec("max_batch_candidates", 16, "most candidates in one batch; larger groups run as lockstep microbatches",
              ">= 1"),
    ParamSpec("prefix_retain", 8, "text prefixes whose per-layer keys/values are kept for later goals with the same "
              "instruction (bitwise-neutral; 0 = none)", ">= 0"),
    ParamSpec("cfg_mode", "auto", "CFG branches (guidance_scale > 1) in one forward (fused) or two (separate); auto "
              "fuses groups of more than one candidate and keeps a lone candidate bitwise equal to upstream",
              ", ".join(CFG_MODES)),
    ParamSpec("step_capture", "off", "each denoising step's decoder stack captured once per shape and replayed: "
              "cuda_graph (CUDA only) or compile (torch.compile); off = eager", ", ".join(STEP_CAPTURE_MODES)),
    ParamSpec("action_stats_file", "", "per-channel action statistics JSON; empty = the bundled policy's own (pusht) "
              "or publish normalized actions"),
    ParamSpec("action_stats_method", "quantile", "normalization of action_stats_file",
              ", ".join(NORMALIZATION_METHODS)),
    ParamSpec("max_observation_age_s", 1.0, "observations older than this are refused as stale", "> 0"),
    ParamSpec("observation_wait_s", 1.0, "how long a goal with min_observation_stamp waits for a frame that new "
              "(host clock) before it is refused (OBSERVATION_NOT_RECEIVED)", ">= 0"),
    ParamSpec("startup_goal_wait_s", 10.0, "how long a goal waits for the first frame on an image topic that has "
              "delivered nothing yet (a node just started or activated, a camera starting; host clock) before it is "
              "refused (NO_OBSERVATION); 0 = refuse at once", ">= 0"),
    ParamSpec("require_state", False, "also refuse goals without a recent, finite ~/observation/state (always on "
              "for models that consume state)"),
    ParamSpec("max_state_skew_s", 0.05, "a model that takes state pairs the image with the ~/observation/state "
              "stamped nearest it; goals whose pair is further apart than this (header stamps) are refused "
              "(STATE_SKEW)", "> 0"),
    ParamSpec("goal_policy", "preempt", "what a new goal does when max_concurrent_goals are running",
              ", ".join(GOAL_POLICIES)),
    ParamSpec("max_concurrent_goals", 1, "goals served at the same time (co-batched when > 1)", ">= 1"),
    ParamSpec("publish_candidates", False, "publish every goal's candidates on ~/candidates"),
    ParamSpec("joint_names", [""], "joint names for ~/joint_trajectory; [''] = no joint trajectory",
              "one name per action channel"),
    ParamSpec("image_topics", [""], "image topics tiled left to right into one observation; [''] = "
              "~/observation/image"),
    ParamSpec("limits_file", "", "per-channel action limits YAML (min/max, max_velocity, max_acceleration, "
              "max_start_jump; docs/safety-and-uncertainty.md): candidates outside them are dropped before reduction; "
              "empty = NaN/Inf checks only", "empty or an existing file"),
    ParamSpec("min_valid_candidates", 1, "goals with fewer candidates passing the checks end ABORTED "
              "(TOO_FEW_VALID_CANDIDATES) and publish nothing", "1 .. max_candidates"),
    ParamSpec("position_limit_policy", "drop", "candidates outside the limits_file min/max are dropped, or clamped to "
              "them (clamping is reported per goal)", ", ".join(POSITION_LIMIT_POLICIES)),
    ParamSpec("start_jump_joints", [""], "~/observation/state joints, in action order, that max_start_jump is measured "
              "from; [''] = joint_names", "one name per action channel"),
    ParamSpec("uncertainty_threshold", 0.0, "calibrated threshold of the uncertainty score (trajectory-ensemble "
              "calibrate): goals above it are marked uncertain and /diagnostics warns; 0 = none", ">= 0"),
    ParamSpec("uncertainty_calibration_file", "", "read the threshold from a trajectory-ensemble calibrate JSON "
              "instead of uncertainty_threshold", "empty or an existing file; not with uncertainty_threshold"),
    ParamSpec("novelty_scorer_file", "", "observation novelty scorer (.safetensors written by trajectory-ensemble "
              "calibrate beside its JSON): every goal reports novelty_score and novel, and uncertain follows "
              "uncertainty_rule; empty = none", "empty or an existing .safetensors file; needs "
              "uncertainty_calibration_file from the same calibrate run"),
    ParamSpec("uncertainty_rule", "", "which scores raise uncertain: spread, novelty, either or both (FIPER's); '' = "
              "the calibration file's recommended rule (combined.rule) with a scorer, spread without",
              "'' or " + ", ".join(ALARM_RULES) + "; all but spread need novelty_scorer_file"),
    ParamSpec("uncertainty_window", 1, "goals of one episode (a chain of continued chunks; a reset or a fresh goal "
              "starts a new one) whose mean scores decide uncertain and novel; 1 = each goal alone", ">= 1"),
    ParamSpec("continue_previous", False, "goals continue the chunk served last (guided toward it, frozen actions "
              "kept) unless they set reset_context; goals can also ask for it themselves"),
    ParamSpec("guidance_mode", "prefix", "guidance of continued goals toward the previous chunk when the goal leaves "
              "guidance empty", ", ".join(GUIDANCE_MODES)),
    ParamSpec("continuity_reducer", "mode_continuity", "reducer of continued goals that name none: the mode "
              "consistent with the previous chunk; '' = the reducer parameter", "a reducer valid for the action "
              "space, or ''"),
    ParamSpec("allow_pickle_weights", False, "allow loading a model directory with pickle-only weights"),
    ParamSpec("enable_weight_updates", False, "serve ~/update_weights (otherwise it answers success=false)"),
    ParamSpec("weights_dir", "", "the only folder ~/update_weights may read from", "required with "
              "enable_weight_updates"),
    ParamSpec("rollout_dir", "", "folder rollout records are written to; empty = rollout goals are refused"),
    ParamSpec("rollout_noise_level", 0.7, "Flow-GRPO noise level of rollout goals", ">= 0"),
    ParamSpec("max_instruction_chars", 2000, "instructions (goal or ~/instruction) with more characters are refused "
              "before any work", ">= 1"),
    ParamSpec("max_instruction_tokens", 512, "instructions with more tokens (the pipeline's tokenizer) are refused "
              "before any model work; 0 = characters only", ">= 0"),
    ParamSpec("max_image_bytes", 64 * 1024 * 1024, "image messages with more data bytes are refused on arrival",
              ">= 1"),
    ParamSpec("max_image_pixels", 4096 * 4096, "image messages with more width*height pixels are refused on arrival",
              ">= 1"),
    ParamSpec("fault_injection", "", "TEST ONLY: arm one engine fault for the next goal; refused unless "
              f"{TESTING_ENV}=1", '"" (off), ' + ", ".join(FAULTS), read_only=False),
    # Read by `trajectory-ensemble serve-openpi` only (docs/openpi.md): one file configures both faces.
    ParamSpec("autostart", True, "configure and activate at start (a managed node's lifecycle run by itself); false: "
              "wait in unconfigured for a lifecycle manager (nav2 lifecycle_manager, trajectory-ensemble lifecycle)"),
    ParamSpec("warmup_counts", [0, 1], "configure runs one group per count on a synthetic frame before serving "
              "(kernels, allocations, step capture; and the costs deadlines are planned from); 0 = candidate_count; "
              "[-1] = none (goals with a deadline are then refused until a goal has measured a step)",
              "each 0 or 1 .. max_candidates, or [-1]"),
    ParamSpec("publish_markers", False, "publish every goal's candidates and served trajectory on ~/markers "
              "(visualization_msgs/MarkerArray, for RViz and Foxglove)"),
    ParamSpec("marker_channels", [0, 1], "action channels drawn as x, y (and z) on ~/markers",
              "2 or 3 distinct channels < the action width"),
    ParamSpec("marker_frame_id", "map", "frame of ~/markers", "non-empty"),
    ParamSpec("marker_lifetime_s", 2.0, "seconds each marker stays up (0 = until replaced)", ">= 0"),
    ParamSpec("openpi_schema", "toy", "serve-openpi: which request keys carry the image(s), state and prompt",
              "toy or droid"),
    ParamSpec("openpi_max_concurrent", 8, "serve-openpi: requests (from any connections) in the engine at once, "
              "co-batched; 1 serves them one at a time", ">= 1"),
    ParamSpec("openpi_max_queued", 32, "serve-openpi: requests waiting beyond openpi_max_concurrent; more get a "
              "CAPACITY error frame", ">= 0"),
    ParamSpec("openpi_max_message_bytes", 16 * 1024 * 1024, "serve-openpi: largest message; a larger one closes its "
              "connection (close code 1009, message too big)", ">= 1024"),
    ParamSpec("openpi_max_inbound_bytes", 0, "serve-openpi: bytes of request frames read and not yet answered, across "
              "all connections; past it no connection is read from (TCP backpressure) until replies free room; "
              "0 = 4 x openpi_max_message_bytes", ">= 0"),
    ParamSpec("openpi_idle_timeout_s", 30.0, "serve-openpi: a connection with no request for this long is closed; "
              "0 = never", ">= 0"),
    ParamSpec("openpi_max_connections", 64, "serve-openpi: connections at once; more are refused at the handshake "
              "(HTTP 503)", ">= 1"),
    ParamSpec("openpi_max_connections_per_client", 16, "serve-openpi: connections of one client (key and peer address) "
              "at once; past it the client's oldest connection without a request is closed, else HTTP 503; 0 = no cap",
              ">= 0"),
    ParamSpec("openpi_handshake_idle_s", 5.0, "serve-openpi: a connection without a request for this long is closed "
              "to make room when openpi_max_connections is reached", ">= 0"),
    ParamSpec("openpi_samples_per_request", 0, "serve-openpi: most candidates one request may draw (advertised in "
              "the handshake); 0 = up to max_candidates, 1 = one sample per request as vLLM-Omni", ">= 0"),
    ParamSpec("engine", "local", "where the model runs: local (this process) or openpi (a remote OpenPI server)",
              ", ".join(ENGINES)),
    ParamSpec("engine_url", "", "engine: openpi: the server's ws:// or wss:// url", "ws://HOST:PORT or wss://..."),
    ParamSpec("engine_api_key_env", "", "engine: openpi: the NAME of the environment variable holding the server's "
              "key ('' = no key); never the key itself", "empty or a set environment variable"),
    ParamSpec("engine_timeout_s", 10.0, "engine: openpi: bound of a connect and handshake, and of a reply without "
              "a deadline past its expected time", "> 0"),
)
PARAMETER_NAMES = tuple(spec.name for spec in PARAMETERS)


@dataclass(frozen=True)
class NodeParams:
    """The validated parameters (lists with the ``[""]`` placeholder become empty tuples)."""

    model: str
    device: str
    dtype: str
    seed: int
    instruction: str
    domain_name: str
    chunk_size: int
    resolution_tier: int
    view_point: str
    fps: float
    num_inference_steps: int
    guidance_scale: float
    candidate_count: int
    reducer: str
    mode_threshold: float
    max_candidates: int
    max_batch_candidates: int
    prefix_retain: int
    cfg_mode: str
    step_capture: str
    action_stats_file: str
    action_stats_method: str
    max_observation_age_s: float
    observation_wait_s: float
    startup_goal_wait_s: float
    require_state: bool
    max_state_skew_s: float
    goal_policy: str
    max_concurrent_goals: int
    publish_candidates: bool
    joint_names: tuple[str, ...]
    image_topics: tuple[str, ...]
    limits_file: str
    min_valid_candidates: int
    position_limit_policy: str
    start_jump_joints: tuple[str, ...]
    uncertainty_threshold: float
    uncertainty_calibration_file: str
    novelty_scorer_file: str
    uncertainty_rule: str
    uncertainty_window: int
    continue_previous: bool
    guidance_mode: str
    continuity_reducer: str
    allow_pickle_weights: bool
    enable_weight_updates: bool
    weights_dir: str
    rollout_dir: str
    rollout_noise_level: float
    max_instruction_chars: int
    max_instruction_tokens: int
    max_image_bytes: int
    max_image_pixels: int
    fault_injection: str
    autostart: bool
    warmup_counts: tuple[int, ...]
    publish_markers: bool
    marker_channels: tuple[int, ...]
    marker_frame_id: str
    marker_lifetime_s: float
    openpi_schema: str
    openpi_max_concurrent: int
    openpi_max_queued: int
    openpi_max_message_bytes: int
    openpi_max_inbound_bytes: int
    openpi_idle_timeout_s: float
    openpi_max_connections: int
    openpi_max_connections_per_client: int
    openpi_handshake_idle_s: float
    openpi_samples_per_request: int
    engine: str
    engine_url: str
    engine_api_key_env: str
    engine_timeout_s: float

    @property
    def action_dim(self) -> int:
        """The raw action width of ``domain_name``."""
        return _WIDTHS[self.domain_name]

    @property
    def dt(self) -> float:
        """Seconds between trajectory rows."""
        return 1.0 / self.fps


class _Problems(list[str]):
    """The problems found so far, in the order they are reported."""

    def need(self, ok: bool, message: str) -> None:
        if not ok:
            self.append(message)


def validate(raw: Mapping[str, Any], *, env: Mapping[str, str] | None = None) -> NodeParams:
    """Check every parameter; missing ones take their default.

    Args:
        raw (`Mapping[str, Any]`): Parameter values by name.
        env (`Mapping[str, str]`, *optional*): Environment (for the test-only hook); defaults to ``os.environ``.

    Raises:
        ParameterError: listing every problem (unknown names included), each prefixed with the parameter name.
    """
    problems = _Problems()
    # key=str: a params file read without rclpy may have non-string keys (``1: 2``), which do not sort with names.
    unknown = sorted(set(raw) - set(PARAMETER_NAMES), key=str)
    for name in unknown:
        label = name if isinstance(name, str) else preview(name)
        problems.append(f"{label}: unknown parameter (known: {', '.join(PARAMETER_NAMES)})")
    values = {spec.name: coerce(spec.name, raw.get(spec.name, spec.default), spec.default, problems)
              for spec in PARAMETERS}
    domain_ok = _check_model(values, problems)
    count_ok = _check_batching(values, problems)
    _check_serving_limits(values, problems)
    _check_joints_and_reducer(values, problems, domain_ok, count_ok)
    _check_validity_and_uncertainty(values, problems)
    _check_continuity(values, problems, domain_ok)
    _check_topics_warmup_markers(values, problems, domain_ok)
    check_engine(values, problems, env)
    try:
        check_fault_injection(values["fault_injection"], env)
    except ParameterError as error:
        problems.append(str(error))
    if problems:
        raise ParameterError("invalid parameters:\n  " + "\n  ".join(problems))
    return NodeParams(**{f.name: values[f.name] for f in fields(NodeParams)})


def _check_model(p: Mapping[str, Any], problems: _Problems) -> bool:
    """Model, device, domain, chunk shape, steps, guidance; True when the domain has a fixed action width."""
    need = problems.need
    need(p["dtype"] in DTYPE_NAMES, f"dtype: {p['dtype']!r} is not one of {list(DTYPE_NAMES)}")
    need(p["device"] == "auto" or p["device"] == "cpu" or p["device"].split(":")[0] == "cuda",
         f"device: {p['device']!r} is not auto, cpu, cuda or cuda:N")
    need(p["model"] != "", "model: must be tiny, toy, pusht or a directory, got ''")
    need(p["seed"] >= 0, f"seed: must be >= 0, got {p['seed']}")
    domain_ok = p["domain_name"] in _WIDTHS
    need(domain_ok, f"domain_name: {p['domain_name']!r} has no fixed action width; expected one of "
                    f"{sorted(_WIDTHS)}")
    need(p["chunk_size"] >= 1, f"chunk_size: must be >= 1, got {p['chunk_size']}")
    need(p["resolution_tier"] in RESOLUTION_TIERS,
         f"resolution_tier: {p['resolution_tier']} is not one of {list(RESOLUTION_TIERS)}")
    need(p["view_point"] in VIEW_POINTS, f"view_point: {p['view_point']!r} is not one of {list(VIEW_POINTS)}")
    need(p["fps"] > 0, f"fps: must be > 0, got {p['fps']}")
    need(p["num_inference_steps"] >= 1, f"num_inference_steps: must be >= 1, got {p['num_inference_steps']}")
    need(p["guidance_scale"] > 0, f"guidance_scale: must be > 0, got {p['guidance_scale']}")
    return domain_ok


def _check_batching(p: Mapping[str, Any], problems: _Problems) -> bool:
    """Counts, batching, CFG, step capture, the stats method; True when ``candidate_count`` is valid."""
    need = problems.need
    need(p["max_candidates"] >= 1, f"max_candidates: must be >= 1, got {p['max_candidates']}")
    count_ok = True
    try:
        check_count(p["candidate_count"], max(1, p["max_candidates"]))
    except InvalidSpecError as error:
        problems.append(str(error))
        count_ok = False
    need(p["max_batch_candidates"] >= 1, f"max_batch_candidates: must be >= 1, got {p['max_batch_candidates']}")
    need(p["prefix_retain"] >= 0, f"prefix_retain: must be >= 0, got {p['prefix_retain']}")
    need(p["cfg_mode"] in CFG_MODES, f"cfg_mode: {p['cfg_mode']!r} is not one of {list(CFG_MODES)}")
    need(p["step_capture"] in STEP_CAPTURE_MODES,
         f"step_capture: {p['step_capture']!r} is not one of {list(STEP_CAPTURE_MODES)}")
    need(p["step_capture"] != "cuda_graph" or p["device"].split(":")[0] in ("cuda", "auto"),
         f"step_capture: 'cuda_graph' needs a CUDA device, but device is {p['device']!r}")
    need(p["action_stats_method"] in NORMALIZATION_METHODS,
         f"action_stats_method: {p['action_stats_method']!r} is not one of {list(NORMALIZATION_METHODS)}")
    return count_ok


def _check_serving_limits(p: Mapping[str, Any], problems: _Problems) -> None:
    """Observation ages and waits, the goal policy, input limits, the OpenPI face's limits, the weights folder."""
    need = problems.need
    need(p["max_observation_age_s"] > 0, f"max_observation_age_s: must be > 0, got {p['max_observation_age_s']}")
    need(p["observation_wait_s"] >= 0, f"observation_wait_s: must be >= 0, got {p['observation_wait_s']}")
    need(p["startup_goal_wait_s"] >= 0, f"startup_goal_wait_s: must be >= 0, got {p['startup_goal_wait_s']}")
    need(p["max_state_skew_s"] > 0, f"max_state_skew_s: must be > 0, got {p['max_state_skew_s']}")
    need(p["goal_policy"] in GOAL_POLICIES, f"goal_policy: {p['goal_policy']!r} is not one of {list(GOAL_POLICIES)}")
    need(p["max_concurrent_goals"] >= 1, f"max_concurrent_goals: must be >= 1, got {p['max_concurrent_goals']}")
    need(p["rollout_noise_level"] >= 0, f"rollout_noise_level: must be >= 0, got {p['rollout_noise_level']}")
    for name in ("max_instruction_chars", "max_image_bytes", "max_image_pixels"):
        need(p[name] >= 1, f"{name}: must be >= 1, got {p[name]}")
    need(p["max_instruction_tokens"] >= 0, f"max_instruction_tokens: must be >= 0, got {p['max_instruction_tokens']}")
    for name, least in (("openpi_max_concurrent", 1), ("openpi_max_queued", 0), ("openpi_max_message_bytes", 1024),
                        ("openpi_max_inbound_bytes", 0), ("openpi_idle_timeout_s", 0), ("openpi_max_connections", 1),
                        ("openpi_max_connections_per_client", 0), ("openpi_handshake_idle_s", 0)):
        need(p[name] >= least, f"{name}: must be >= {least}, got {p[name]}")
    need(not p["enable_weight_updates"] or p["weights_dir"] != "",
         "weights_dir: must be set when enable_weight_updates is true (the only folder updates are read from)")
    if p["weights_dir"]:
        need(os.path.isdir(p["weights_dir"]), f"weights_dir: {p['weights_dir']!r} is not an existing directory")


def _check_joints_and_reducer(p: Mapping[str, Any], problems: _Problems, domain_ok: bool, count_ok: bool) -> None:
    """Joint names and the default reducer against the action width (a goal's own check); mode_threshold."""
    need = problems.need
    if domain_ok:
        width = _WIDTHS[p["domain_name"]]
        names = p["joint_names"]
        need(not names or len(names) == width,
             f"joint_names: {len(names)} names {list(names)} but domain_name {p['domain_name']!r} has action width "
             f"{width}; give exactly {width} names, or [''] for no joint trajectory")
        need(len(set(names)) == len(names), f"joint_names: names must be unique, got {list(names)}")
        try:
            # The same check as a goal's; the model's own reducer list joins it once the model is loaded.
            if count_ok:
                check_request(p["candidate_count"], p["reducer"], max_count=max(1, p["max_candidates"]),
                              action_dim=width, domain_name=p["domain_name"])
            else:
                check_reducer(p["reducer"], width, domain_name=p["domain_name"])
        except InvalidSpecError as error:
            problems.append(f"reducer: {error}")
    try:
        check_mode_threshold(p["mode_threshold"])
    except InvalidSpecError as error:
        problems.append(f"mode_threshold: {error}")


def _check_validity_and_uncertainty(p: Mapping[str, Any], problems: _Problems) -> None:
    """Candidate validity (limits file, policy) and the uncertainty and novelty settings."""
    need = problems.need
    need(1 <= p["min_valid_candidates"] <= max(1, p["max_candidates"]),
         f"min_valid_candidates: must be in [1, max_candidates={p['max_candidates']}], got {p['min_valid_candidates']}")
    need(p["position_limit_policy"] in POSITION_LIMIT_POLICIES,
         f"position_limit_policy: {p['position_limit_policy']!r} is not one of {list(POSITION_LIMIT_POLICIES)}")
    for name in ("limits_file", "uncertainty_calibration_file"):
        if p[name]:
            need(os.path.isfile(p[name]), f"{name}: {p[name]!r} is not an existing file")
    need(p["uncertainty_threshold"] >= 0, f"uncertainty_threshold: must be >= 0, got {p['uncertainty_threshold']}")
    need(not (p["uncertainty_threshold"] and p["uncertainty_calibration_file"]),
         "uncertainty_threshold: set it or uncertainty_calibration_file, not both")
    if p["novelty_scorer_file"]:
        need(os.path.isfile(p["novelty_scorer_file"]) and p["novelty_scorer_file"].endswith(".safetensors"),
             f"novelty_scorer_file: {p['novelty_scorer_file']!r} is not an existing .safetensors file")
        need(bool(p["uncertainty_calibration_file"]), "novelty_scorer_file: needs uncertainty_calibration_file (the "
             "calibrate JSON written with the scorer, which holds its thresholds)")
    need(p["uncertainty_rule"] in ("", *ALARM_RULES),
         f"uncertainty_rule: {p['uncertainty_rule']!r} is not one of {['', *ALARM_RULES]}")
    need(p["uncertainty_rule"] in ("", "spread") or bool(p["novelty_scorer_file"]),
         f"uncertainty_rule: {p['uncertainty_rule']!r} needs novelty_scorer_file")
    need(p["uncertainty_window"] >= 1, f"uncertainty_window: must be >= 1, got {p['uncertainty_window']}")


def _check_continuity(p: Mapping[str, Any], problems: _Problems, domain_ok: bool) -> None:
    """Guidance and reducer of continued goals, and the joints start jumps are measured from."""
    need = problems.need
    need(p["guidance_mode"] in GUIDANCE_MODES,
         f"guidance_mode: {p['guidance_mode']!r} is not one of {list(GUIDANCE_MODES)}")
    if domain_ok:
        width = _WIDTHS[p["domain_name"]]
        need(not p["start_jump_joints"] or len(p["start_jump_joints"]) == width,
             f"start_jump_joints: {len(p['start_jump_joints'])} names {list(p['start_jump_joints'])} but the action "
             f"width is {width}")
        if p["continuity_reducer"]:
            try:
                check_reducer(p["continuity_reducer"], width, domain_name=p["domain_name"])
            except InvalidSpecError as error:
                problems.append(f"continuity_reducer: {error}")


def _check_topics_warmup_markers(p: Mapping[str, Any], problems: _Problems, domain_ok: bool) -> None:
    """Image topics, warm-up counts and the ``~/markers`` settings."""
    need = problems.need
    need(len(set(p["image_topics"])) == len(p["image_topics"]),
         f"image_topics: topics must be unique, got {list(p['image_topics'])}")
    if list(p["warmup_counts"]) != [-1]:
        bad_counts = [c for c in p["warmup_counts"] if not 0 <= c <= max(1, p["max_candidates"])]
        need(not bad_counts, f"warmup_counts: {bad_counts} outside 0 .. max_candidates={p['max_candidates']} "
                             f"(0 = candidate_count; [-1] = none), got {list(p['warmup_counts'])}")
    if domain_ok:
        channels, width = p["marker_channels"], _WIDTHS[p["domain_name"]]
        need(len(channels) in (2, 3) and len(set(channels)) == len(channels) and all(0 <= c < width for c in channels),
             f"marker_channels: {list(channels)} must be 2 or 3 distinct action channels (x, y[, z]) below the action "
             f"width {width}")
    need(bool(p["marker_frame_id"]), "marker_frame_id: must be a frame name, got ''")
    need(p["marker_lifetime_s"] >= 0, f"marker_lifetime_s: must be >= 0, got {p['marker_lifetime_s']}")
