"""Fast unit tests of the node's pure parts: no DDS, no subprocess (rclpy message classes only)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from sensor_msgs.msg import Image, JointState  # noqa: E402
from trajectory_ensemble_msgs.action import GenerateTrajectory  # noqa: E402

from trajectory_ensemble_node.contract import CandidateGroup, CandidateTrajectorySpec, EnsembleResult  # noqa: E402
from trajectory_ensemble_node.errors import (  # noqa: E402
    CandidateCountError,
    ErrorCode,
    GroupCanceledError,
    GroupPreemptedError,
    ReducerLayoutError,
    UnknownReducerError,
)
from trajectory_ensemble_node.models.cosmos3.loading import (  # noqa: E402
    ModelLoadError,
    PickleWeightsError,
    load_pipeline,
    model_notice,
    pickle_only_files,
    resolve_device,
)
from trajectory_ensemble_node.ros import conversions, diagnostics, goals, observations, params, serve  # noqa: E402
from trajectory_ensemble_node.ros.faults import FaultInjector  # noqa: E402
from trajectory_ensemble_node.ros.weight_updates import WeightsPathError, resolve_update_path  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


# --- observations ----------------------------------------------------------------------------------------------------


def image(encoding: str, height: int = 2, width: int = 3, *, step: int | None = None, data: bytes | None = None,
          sec: int = 7) -> Image:
    channels = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1}.get(encoding, 3)
    step = width * channels if step is None else step
    if data is None:
        data = bytes(range(step * height))
    msg = Image(height=height, width=width, encoding=encoding, step=step, data=data)
    msg.header.stamp.sec = sec
    msg.header.frame_id = "cam"
    return msg


def test_every_supported_encoding_becomes_rgb_uint8():
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    cases = {
        "rgb8": rgb.tobytes(),
        "bgr8": rgb[..., ::-1].tobytes(),
        "rgba8": np.concatenate([rgb, np.full((2, 3, 1), 255, np.uint8)], axis=-1).tobytes(),
        "bgra8": np.concatenate([rgb[..., ::-1], np.full((2, 3, 1), 9, np.uint8)], axis=-1).tobytes(),
    }
    for encoding, data in cases.items():
        out = observations.image_to_rgb(encoding, 2, 3, len(data) // 2, data)
        assert out.dtype == np.uint8 and out.shape == (2, 3, 3), encoding
        np.testing.assert_array_equal(out, rgb, err_msg=encoding)
    mono = observations.image_to_rgb("mono8", 2, 3, 3, bytes(range(6)))
    np.testing.assert_array_equal(mono[..., 0], mono[..., 2])
    np.testing.assert_array_equal(mono[..., 1], np.arange(6).reshape(2, 3))


def test_padded_rows_are_cropped_and_array_data_is_read_without_copy_errors():
    data = bytes([1, 2, 3, 4, 5, 6, 0, 0, 7, 8, 9, 10, 11, 12, 0, 0])  # two 2-pixel rows padded to 8 bytes
    out = observations.image_to_rgb("rgb8", 2, 2, 8, data)
    assert out.reshape(-1).tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    msg = image("rgb8", step=8, data=data, width=2)  # rclpy stores uint8[] as array.array
    assert observations.image_to_rgb(msg.encoding, 2, 2, 8, msg.data).shape == (2, 2, 3)


@pytest.mark.parametrize(
    ("msg", "error", "cause"),
    [
        (image("32FC1"), observations.UnsupportedEncodingError, "encoding"),
        (image("rgb8", step=5), observations.FrameStepError, "step"),
        (image("rgb8", data=bytes(17)), observations.FrameDataLengthError, "data_length"),
        (image("rgb8", height=0, data=b""), observations.FrameDimensionsError, "dimensions"),
    ],
)
def test_bad_frames_are_rejected_by_name_counted_and_the_last_good_frame_stays(msg, error, cause):
    clock = [100.0]
    buffer = observations.ObservationBuffer(["/img"], "/state", clock=lambda: clock[0])
    assert buffer.offer_image("/img", image("rgb8", sec=1)) is None
    rejection = buffer.offer_image("/img", msg)
    assert isinstance(rejection, error) and rejection.cause == cause
    assert buffer.first_rejection(rejection) and not buffer.first_rejection(rejection)
    assert buffer.offer_image("/img", msg).cause == cause
    assert buffer.rejected_counts()[cause] == 2 and sum(buffer.rejected_counts().values()) == 2
    assert buffer.latest(1.0).stamp.sec == 1  # the good frame is still served
    assert buffer.received_count() == 1


def test_missing_stale_and_nan_state_are_refused_with_topic_and_age():
    clock = [10.0]
    buffer = observations.ObservationBuffer(["/a", "/b"], "/state", clock=lambda: clock[0])
    with pytest.raises(observations.NoObservationError, match="/a"):
        buffer.latest(1.0)
    buffer.offer_image("/a", image("rgb8", sec=5))
    with pytest.raises(observations.NoObservationError, match="/b") as info:
        buffer.latest(1.0)
    assert info.value.code == ErrorCode.NO_OBSERVATION
    clock[0] = 10.5
    buffer.offer_image("/b", image("rgb8", sec=6, width=2, height=1))
    clock[0] = 10.9
    obs = buffer.latest(1.0)
    # Tiled left to right, padded to the tallest; stamped with (and as old as) the oldest part.
    assert obs.image.shape == (2, 5, 3) and obs.stamp.sec == 5 and obs.age_s == pytest.approx(0.9)
    assert (obs.image[1, 3:] == 0).all()
    clock[0] = 11.2
    with pytest.raises(observations.StaleObservationError, match=r"/a is 1\.20 s old") as info:
        buffer.latest(1.0)
    assert info.value.code == ErrorCode.STALE_OBSERVATION
    clock[0] = 10.9
    with pytest.raises(observations.NoObservationError, match="joint state"):
        buffer.latest(1.0, require_state=True)
    buffer.offer_state(JointState(name=["a", "b"], position=[0.0, float("nan")]))
    with pytest.raises(observations.NonFiniteStateError, match="joints b") as info:
        buffer.latest(1.0, require_state=True)
    assert info.value.code == ErrorCode.NON_FINITE_STATE
    buffer.offer_state(JointState(name=["a", "b"], position=[0.0, 1.0]))
    assert buffer.latest(1.0, require_state=True).state.positions.tolist() == [0.0, 1.0]
    assert set(buffer.ages()) == {"/a", "/b", "/state"}


# --- conversions -------------------------------------------------------------------------------------------------------


def ensemble_result(count: int = 3, horizon: int = 4, width: int = 2, *, candidates: bool = True) -> EnsembleResult:
    spec = CandidateTrajectorySpec(count=count, reducer="mean", return_candidates=candidates)
    cands = torch.arange(count * horizon * width, dtype=torch.float32).reshape(count, horizon, width)
    return EnsembleResult(
        group=CandidateGroup.for_spec("r", spec), spec=spec, action=cands.mean(0), candidate_ids=tuple(range(count)),
        seeds=tuple(range(100, 100 + count)), candidates=cands if candidates else None,
        metrics={"total_ms": 12.5, "candidate_count": count, "fallback_reason": None},
    )


def test_trajectory_and_candidates_are_row_major_and_carry_the_observation_header():
    result = ensemble_result()
    stamp = SimpleNamespace(sec=42, nanosec=7)
    header = conversions.make_header(stamp, "cam")
    msg = conversions.trajectory_msg(result, header=header, domain_name="pusht", dt=0.125, normalized=True)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id) == (42, 7, "cam")
    assert (msg.horizon, msg.action_dim, msg.candidate_count, msg.base_seed) == (4, 2, 3, 100)
    assert msg.reducer == "mean" and msg.normalized and msg.dt == pytest.approx(0.125)
    np.testing.assert_allclose(np.asarray(msg.data).reshape(4, 2), result.action.numpy())
    cands = conversions.candidates_msg(result, header=header, domain_name="pusht", dt=0.125, normalized=False)
    assert list(cands.seeds) == [100, 101, 102] and list(cands.candidate_ids) == [0, 1, 2]
    np.testing.assert_array_equal(np.asarray(cands.data).reshape(3, 4, 2), result.candidates.numpy())
    with pytest.raises(ValueError, match="no candidates"):
        conversions.candidates_msg(ensemble_result(candidates=False), header=header, domain_name="x", dt=1.0,
                                   normalized=True)


def test_joint_trajectory_points_are_reached_at_k_plus_one_dt():
    action = torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])
    header = conversions.make_header(SimpleNamespace(sec=1, nanosec=0), "base")
    msg = conversions.joint_trajectory_msg(action, joint_names=["x", "y"], dt=0.4, header=header)
    assert list(msg.joint_names) == ["x", "y"] and len(msg.points) == 3
    times = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in msg.points]
    assert times == pytest.approx([0.4, 0.8, 1.2])
    assert list(msg.points[2].positions) == [4.0, 5.0]
    with pytest.raises(ValueError, match="2 joint names"):
        conversions.joint_trajectory_msg(torch.zeros(3, 5), joint_names=["x", "y"], dt=0.1, header=header)


def test_metrics_become_key_values_with_units_kept_in_the_names():
    values = {kv.key: kv.value for kv in conversions.metrics_key_values(ensemble_result().metrics)}
    assert values == {"total_ms": "12.500", "candidate_count": "3", "fallback_reason": ""}


# --- params ----------------------------------------------------------------------------------------------------------


def test_serve_yaml_declares_exactly_the_node_parameters_with_the_same_defaults():
    raw = yaml.safe_load((REPO / "config" / "serve.yaml").read_text())["/**/trajectory_ensemble"]["ros__parameters"]
    assert set(raw) == set(params.PARAMETER_NAMES)
    for spec in params.PARAMETERS:
        assert raw[spec.name] == spec.default, spec.name
    validated = params.validate(raw)
    assert validated.joint_names == () and validated.image_topics == ()
    # The default is the bundled toy policy with the settings it was trained for, and a reducer that keeps one of
    # its two behaviours.
    from trajectory_ensemble_node.toy import ACTION_SETTINGS, INSTRUCTION

    assert validated.model == "toy" and validated.action_dim == 2 and validated.reducer == "mode"
    assert validated.instruction == INSTRUCTION
    assert all(getattr(validated, name) == value for name, value in ACTION_SETTINGS.items())


def test_bad_parameters_are_all_reported_by_name():
    with pytest.raises(params.ParameterError) as info:
        params.validate({"goal_policy": "drop", "fps": 0, "joint_names": ["a", "b"], "modle": "x", "chunk_size": "8",
                         "enable_weight_updates": True, "domain_name": "droid_lerobot", "prefix_retain": -1,
                         "cfg_mode": "both", "step_capture": "graphs"}, env={})
    text = str(info.value)
    for expected in ("goal_policy: 'drop'", "fps: must be > 0", "modle: unknown parameter", "chunk_size: expected",
                     "prefix_retain: must be >= 0, got -1",
                     "cfg_mode: 'both' is not one of ['auto', 'fused', 'separate']",
                     "step_capture: 'graphs' is not one of ['off', 'cuda_graph', 'compile']",
                     "joint_names: 2 names ['a', 'b'] but domain_name 'droid_lerobot' has action width 10",
                     "weights_dir: must be set"):
        assert expected in text, expected
    with pytest.raises(params.ParameterError, match="reducer: .*pose_gripper.*width 2"):
        params.validate({"reducer": "pose_gripper", "domain_name": "pusht"}, env={})
    with pytest.raises(params.ParameterError, match="step_capture: .cuda_graph. needs a CUDA device, but device is"):
        params.validate({"step_capture": "cuda_graph", "device": "cpu"}, env={})
    with pytest.raises(params.ParameterError, match="reducer: 'nope' is not a reducer"):
        params.validate({"reducer": "nope"}, env={})
    assert params.validate({"fps": 15, "joint_names": [f"j{i}" for i in range(10)], "domain_name": "droid_lerobot"},
                           env={}).fps == 15.0


def test_fault_injection_is_refused_outside_tests():
    with pytest.raises(params.ParameterError, match="TRAJECTORY_ENSEMBLE_TESTING=1"):
        params.validate({"fault_injection": "engine_exception"}, env={})
    assert params.validate({"fault_injection": "engine_exception"},
                           env={"TRAJECTORY_ENSEMBLE_TESTING": "1"}).fault_injection == "engine_exception"
    with pytest.raises(params.ParameterError, match="not one of"):
        params.check_fault_injection("meteor", env={"TRAJECTORY_ENSEMBLE_TESTING": "1"})


# --- goals -------------------------------------------------------------------------------------------------------------


def node_params(**overrides) -> params.NodeParams:
    return params.validate({"candidate_count": 4, "max_candidates": 8, "domain_name": "droid_lerobot",
                            "reducer": "mean", **overrides}, env={})


VALID = ("mean", "median", "medoid", "trimmed_mean", "pose_gripper", "mode")


def test_goal_defaults_limits_and_reducer_checks_happen_before_any_model_work():
    goal = GenerateTrajectory.Goal()
    plan = goals.plan_goal(goal, node_params(), default_instruction="go", valid_reducers=VALID)
    assert (plan.spec.count, plan.spec.reducer, plan.instruction, plan.return_candidates) == (4, "mean", "go", False)
    seeded = goals.plan_goal(GenerateTrajectory.Goal(use_seed=True, seed=2**64 - 1, candidate_count=2,
                                                     return_candidates=True, instruction="x"),
                             node_params(), default_instruction="go", valid_reducers=VALID)
    assert seeded.base_seed == 2**64 - 1 and seeded.spec.count == 2 and seeded.spec.return_candidates
    assert goals.plan_goal(goal, node_params(publish_candidates=True), default_instruction="",
                           valid_reducers=VALID).spec.return_candidates
    with pytest.raises(CandidateCountError, match="candidate_count 9 is above max_candidates=8"):
        goals.plan_goal(GenerateTrajectory.Goal(candidate_count=9), node_params(), default_instruction="",
                        valid_reducers=VALID)
    with pytest.raises(UnknownReducerError, match="unknown reducer 'vote'"):
        goals.plan_goal(GenerateTrajectory.Goal(reducer="vote"), node_params(), default_instruction="",
                        valid_reducers=VALID)
    with pytest.raises(ReducerLayoutError, match="pusht actions have width 2"):
        goals.plan_goal(GenerateTrajectory.Goal(reducer="pose_gripper"), node_params(domain_name="pusht"),
                        default_instruction="", valid_reducers=VALID)
    with pytest.raises(ReducerLayoutError, match="not valid for this model"):
        goals.plan_goal(GenerateTrajectory.Goal(reducer="median"), node_params(), default_instruction="",
                        valid_reducers=("mean",))
    with pytest.raises(goals.GoalRequestError, match="rollout_dir"):
        goals.plan_goal(GenerateTrajectory.Goal(rollout=True), node_params(), default_instruction="",
                        valid_reducers=VALID)


class FakeHandle:
    def __init__(self) -> None:
        self.cancels: list[tuple] = []
        self.callbacks: list = []

    def cancel(self, reason, message=""):
        self.cancels.append((reason.value, message))
        return True

    def add_done_callback(self, callback):
        self.callbacks.append(callback)


def test_preempt_policy_stops_the_oldest_goal_and_names_the_newer_one():
    tracker = goals.GoalTracker("preempt", 1)
    first, second = tracker.register("A"), tracker.register("B")
    assert tracker.admit(first) is False
    handle = FakeHandle()
    first.attach(handle)
    tracker.admit(second)
    assert handle.cancels == [("preempted", "preempted by B")]
    error = first.stop_error()
    assert isinstance(error, GroupPreemptedError) and str(error) == "preempted by B"
    assert isinstance(first.claim_success(), GroupPreemptedError)
    assert tracker.num_running == 1


def test_a_goal_accepted_earlier_but_admitted_later_is_the_one_preempted():
    tracker = goals.GoalTracker("preempt", 1)
    older, newer = tracker.register("A"), tracker.register("B")
    tracker.admit(newer)
    with pytest.raises(GroupPreemptedError, match="preempted by B"):
        tracker.admit(older)
    assert newer.stop_error() is None and tracker.num_running == 1


def test_a_goal_that_committed_to_its_result_can_no_longer_be_preempted_or_canceled():
    tracker = goals.GoalTracker("preempt", 1)
    first = tracker.register("A")
    tracker.admit(first)
    assert first.claim_success() is None
    assert first.request_cancel() is False
    first.preempt("B")
    assert first.stop_error() is None


def test_a_cancel_before_submission_cancels_the_group_as_soon_as_it_exists():
    record = goals.GoalTracker("preempt", 1).register("A")
    assert record.request_cancel()
    handle = FakeHandle()
    record.attach(handle)
    assert handle.cancels[0][0] == "canceled"
    assert isinstance(record.stop_error(), GroupCanceledError)


def test_queue_policy_waits_for_a_slot_and_reject_policy_refuses():
    tracker = goals.GoalTracker("queue", 1)
    first, second = tracker.register("A"), tracker.register("B")
    tracker.admit(first)
    waited: list[bool] = []
    thread = threading.Thread(target=lambda: waited.append(tracker.admit(second)))
    thread.start()
    RosWait.until(lambda: tracker.num_waiting == 1)
    tracker.release(first)
    thread.join(5)
    assert waited == [True] and tracker.num_running == 1
    rejecting = goals.GoalTracker("reject", 1)
    rejecting.admit(rejecting.register("A"))
    assert "goal_policy is reject" in rejecting.should_reject()
    closing = goals.GoalTracker("queue", 1)
    closing.close()
    assert "shutting down" in closing.should_reject()


def test_try_admit_runs_or_preempts_at_once_and_never_queues_a_goal():
    # The accept callback starts a goal with try_admit: it must never block the executor thread.
    preempting = goals.GoalTracker("preempt", 1)
    first, second = preempting.register("A"), preempting.register("B")
    assert preempting.try_admit(first) is True
    handle = FakeHandle()
    first.attach(handle)
    assert preempting.try_admit(second) is True
    assert handle.cancels == [("preempted", "preempted by B")] and preempting.num_running == 1
    queueing = goals.GoalTracker("queue", 1)
    running, later = queueing.register("A"), queueing.register("B")
    assert queueing.try_admit(running) is True
    assert queueing.try_admit(later) is False
    assert queueing.num_waiting == 0 and queueing.num_running == 1  # not queued by the attempt
    rejecting = goals.GoalTracker("reject", 1)
    assert rejecting.try_admit(rejecting.register("A")) is True
    with pytest.raises(goals.GoalRejectedError, match="goal_policy is reject"):
        rejecting.try_admit(rejecting.register("B"))
    canceled = goals.GoalTracker("preempt", 1).register("C")
    canceled.request_cancel()
    with pytest.raises(GroupCanceledError):
        goals.GoalTracker("preempt", 1).try_admit(canceled)


def test_deferred_work_runs_after_its_delay_in_order_coalesces_by_key_and_drains_on_stop():
    import time

    from trajectory_ensemble_node.ros.deferred import Deferred

    ran: list[tuple[str, float]] = []
    deferred = Deferred(0.05, "test-deferred")
    asked = time.monotonic()
    deferred.call(lambda: ran.append(("log", time.monotonic())))
    deferred.call(lambda: ran.append(("diagnostics", time.monotonic())), key="diagnostics")
    deferred.call(lambda: ran.append(("diagnostics", time.monotonic())), key="diagnostics")  # coalesced
    deferred.call(lambda: 1 / 0)  # swallowed: later work still runs
    deferred.call(ran.append, ("last", 0.0))
    RosWait.until(lambda: len(ran) == 3)
    assert [name for name, _ in ran] == ["log", "diagnostics", "last"]
    assert ran[0][1] - asked >= 0.045  # not before its delay: the result goes out first
    deferred.call(lambda: ran.append(("pending at stop", 0.0)))
    deferred.stop()
    assert ran[-1][0] == "pending at stop"
    deferred.call(lambda: ran.append(("after stop", 0.0)))
    assert ran[-1][0] == "pending at stop"


class RosWait:
    @staticmethod
    def until(predicate, timeout: float = 5.0) -> None:
        import time

        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline
            time.sleep(0.01)


# --- diagnostics -------------------------------------------------------------------------------------------------------


def test_diagnostics_follow_diagnostic_updater_names_and_levels():
    inputs = diagnostics.DiagnosticsInputs(
        node_name="trajectory_ensemble", hardware_id="cpu", model="tiny", notice="untrained demo weights",
        weights_version=2, engine_alive=True, last_metrics={"total_ms": 3.0, "peak_memory_bytes": 10},
        goal_counts={"succeeded": 1, "aborted": 2, "canceled": 0, "preempted": 1, "rejected": 0, "running": 0,
                     "waiting": 0},
        observation_ages={"/img": None}, frames_rejected={"encoding": 1}, image_topics=("/img",),
    )
    array = diagnostics.build_diagnostics(inputs, stamp=conversions.make_header(
        SimpleNamespace(sec=0, nanosec=0), "").stamp)
    engine, goal_status, obs = array.status
    assert [s.name for s in array.status] == ["trajectory_ensemble: engine", "trajectory_ensemble: goals",
                                              "trajectory_ensemble: observations"]
    values = {kv.key: kv.value for kv in engine.values}
    assert engine.level == diagnostics.OK and "untrained demo weights" in engine.message
    assert values["total_ms"] == "3.000" and values["weights_version"] == "2"
    assert {kv.key: kv.value for kv in goal_status.values}["goals_preempted"] == "1"
    assert obs.level == diagnostics.WARN and "no image yet on /img" in obs.message
    assert {kv.key: kv.value for kv in obs.values}["frames_rejected_encoding"] == "1"
    inputs.engine_alive = False
    assert diagnostics.engine_status(inputs).level == diagnostics.ERROR
    inputs.engine_alive, inputs.last_error = True, "ENGINE_FAILURE: boom"
    assert diagnostics.engine_status(inputs).level == diagnostics.WARN


# --- update_weights paths ----------------------------------------------------------------------------------------------


def test_update_paths_stay_inside_weights_dir_and_are_safetensors(tmp_path):
    root = tmp_path / "weights"
    (root / "ckpt" / "transformer").mkdir(parents=True)
    good = root / "w.safetensors"
    good.write_bytes(b"x")
    (root / "ckpt" / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"x")
    (root / "w.pt").write_bytes(b"x")
    outside = tmp_path / "evil.safetensors"
    outside.write_bytes(b"x")
    (root / "link.safetensors").symlink_to(outside)
    assert resolve_update_path(str(root), "w.safetensors") == good.resolve()
    assert resolve_update_path(str(root), str(good)) == good.resolve()
    assert resolve_update_path(str(root), "ckpt").name == "diffusion_pytorch_model.safetensors"
    for path, message in (("../evil.safetensors", "'..'"), (str(outside), "outside weights_dir"),
                          ("link.safetensors", "outside weights_dir"), ("w.pt", "pickle"),
                          ("missing.safetensors", "does not exist"), ("", "empty")):
        with pytest.raises(WeightsPathError, match=message) as info:
            resolve_update_path(str(root), path)
        assert info.value.code == ErrorCode.WEIGHTS_REJECTED
    with pytest.raises(WeightsPathError, match="weights_dir is not set"):
        resolve_update_path("", "w.safetensors")


# --- model loading -----------------------------------------------------------------------------------------------------


def test_loading_refuses_pickle_only_directories_and_unknown_models(tmp_path):
    (tmp_path / "model_index.json").write_text("{}")
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "diffusion_pytorch_model.bin").write_bytes(b"x")
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "diffusion_pytorch_model.bin").write_bytes(b"x")
    (tmp_path / "vae" / "diffusion_pytorch_model.safetensors").write_bytes(b"x")
    assert [p.parent.name for p in pickle_only_files(tmp_path)] == ["transformer"]
    with pytest.raises(PickleWeightsError, match="transformer/diffusion_pytorch_model.bin") as info:
        load_pipeline(str(tmp_path), "cpu")
    assert info.value.code == ErrorCode.WEIGHTS_REJECTED
    with pytest.raises(ModelLoadError, match="neither 'tiny', 'toy' nor an existing directory"):
        load_pipeline(str(tmp_path / "nope"), "cpu")
    with pytest.raises(ModelLoadError, match="model_index.json"):
        load_pipeline(str(tmp_path / "vae"), "cpu")
    with pytest.raises(ModelLoadError, match="dtype"):
        load_pipeline("tiny", "cpu", "float64")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert model_notice("tiny") == "untrained demo weights"


def test_toy_loads_with_its_notice_once_its_weights_are_installed():
    from trajectory_ensemble_node.toy import TOY_NOTICE, toy_pipeline_dir

    if not (toy_pipeline_dir() / "model_index.json").is_file():
        with pytest.raises(ModelLoadError, match="train-toy"):
            load_pipeline("toy", "cpu")
        return
    pipe, notice = load_pipeline("toy", "cpu")
    assert notice == TOY_NOTICE and model_notice("toy") == TOY_NOTICE
    assert pipe.transformer.dtype == torch.float32


def test_tiny_loads_with_its_notice_and_a_saved_copy_loads_from_its_directory(tmp_path):
    pipe, notice = load_pipeline("tiny", "cpu", "float32", seed=3)
    assert notice == "untrained demo weights"
    pipe.save_pretrained(str(tmp_path), safe_serialization=True)
    loaded, notice = load_pipeline(str(tmp_path), "cpu")
    assert notice == f"weights from {tmp_path}"
    for (name, a), (_, b) in zip(pipe.transformer.state_dict().items(), loaded.transformer.state_dict().items()):
        assert torch.equal(a, b), name


# --- serve and faults --------------------------------------------------------------------------------------------------


def test_serve_passes_the_params_file_and_ros_args_through(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    params_file = tmp_path / "p.yaml"
    params_file.write_text("{}")
    args = parser.parse_args(["--params-file", str(params_file), "--ros-args", "-p", "fps:=5.0", "-r", "__ns:=/r"])
    assert serve.build_argv(args.params_file, args.ros_args) == [
        "trajectory_ensemble_node", "--ros-args", "--params-file", str(params_file), "-p", "fps:=5.0", "-r", "__ns:=/r"]
    assert serve.build_argv(None, []) == ["trajectory_ensemble_node"]
    with pytest.raises(SystemExit, match="does not exist"):
        serve.build_argv(str(tmp_path / "missing.yaml"), [])


def test_fault_injector_fires_once_then_the_adapter_is_back_to_normal():
    output = SimpleNamespace(candidates=torch.zeros(2, 3))
    adapter = SimpleNamespace(forward=lambda slices, should_abort=None: 1, finish=lambda state: output)
    faults = FaultInjector(adapter)
    faults.arm("engine_exception")
    with pytest.raises(RuntimeError, match="injected"):
        adapter.forward([])
    assert adapter.forward([]) == 1 and faults.armed is None
    faults.arm("out_of_memory")
    with pytest.raises(torch.OutOfMemoryError):
        adapter.forward([])
    faults.arm("nan_candidates")
    assert torch.isnan(adapter.finish(None).candidates).all()
    with pytest.raises(ValueError, match="unknown fault"):
        faults.arm("meteor")
