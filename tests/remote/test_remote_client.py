"""The remote engine (``engine: openpi``) against an in-process ``serve-openpi`` on the toy policy.

A group served remotely is the same group the local model serves, bitwise (action, candidates, seeds), with and
without a continuity context; against a one-sample-per-request server it is N seeded requests reduced here. Network
faults end a group with their named code, and cancel ends the server's group (its ``canceled_on_disconnect``).
"""

from __future__ import annotations

import socket
from typing import Any

import numpy as np
import pytest
import torch
from _openpi_harness import serving, toy_image, wait_until
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.engine.context import ExecutionContext
from trajectory_ensemble_node.errors import (
    ErrorCode,
    GroupCanceledError,
    RemoteDisconnectedError,
    RemoteSchemaError,
    RemoteTimeoutError,
    RemoteUnreachableError,
)
from trajectory_ensemble_node.openpi import OpenPIPolicy
from trajectory_ensemble_node.reducers import configured_reducer
from trajectory_ensemble_node.remote import RemoteModel
from trajectory_ensemble_node.remote.groups import reduce_samples
from trajectory_ensemble_node.serving.params import NodeParams, validate
from trajectory_ensemble_node.serving.request_path import ServedModel, build_request

SEED = 1234


def remote_engine(url: str, **overrides: Any) -> RemoteModel:
    engine = RemoteModel(validate({"engine": "openpi", "engine_url": url, **overrides}))
    engine.start()
    return engine


def group_kwargs(p: NodeParams, *, count: int = 4, reducer: str = "mode", context: ExecutionContext | None = None,
                 seed: int = SEED, request_id: str = "g") -> dict[str, Any]:
    """What the node's ModelHost passes to make_request for a goal on the toy image."""
    action = CosmosActionCondition(mode="policy", chunk_size=p.chunk_size, domain_name=p.domain_name,
                                   resolution_tier=p.resolution_tier, image=toy_image(), view_point=p.view_point)
    spec = CandidateTrajectorySpec(count=count, reducer=reducer, return_candidates=True, max_count=p.max_candidates)
    return dict(prompt=p.instruction, action=action, num_inference_steps=p.num_inference_steps,
                guidance_scale=p.guidance_scale, fps=p.fps, spec=spec, base_seed=seed, request_id=request_id,
                context=context)


def serve_both(local, engine: RemoteModel, **kwargs: Any):
    p = engine.params
    here = local.wait(local.submit_request(local.make_request(**group_kwargs(p, **kwargs))), timeout=120)
    there = engine.wait(engine.submit_request(engine.make_request(**group_kwargs(p, **kwargs))), timeout=120)
    return here, there


def assert_bitwise(here, there) -> None:
    assert there.seeds == here.seeds
    assert torch.equal(there.action, here.action)
    assert torch.equal(there.candidates, here.candidates)


def test_a_remote_group_equals_the_local_group_bitwise(toy_policy):
    with serving(toy_policy) as server:
        engine = remote_engine(server.url)
        try:
            assert engine.remote_status()["state"] == "connected" and engine.samples_per_request is not None
            here, there = serve_both(toy_policy.model, engine)
        finally:
            engine.stop()
        assert_bitwise(here, there)
        assert server.server.counts["replies"] == 1


def test_the_context_extra_continues_as_a_local_context_group(toy_policy):
    p = validate({})
    first = toy_policy.model.generate(**group_kwargs(p, seed=5))
    context = ExecutionContext(first.action.clone(), previous_stamp=10.0, dt=p.dt, frozen=1, stamp=10.0 + 2 * p.dt)
    with serving(toy_policy) as server:
        engine = remote_engine(server.url)
        try:
            here, there = serve_both(toy_policy.model, engine, reducer=p.continuity_reducer, context=context)
        finally:
            engine.stop()
    assert_bitwise(here, there)
    assert there.metrics["context_frozen"] == here.metrics["context_frozen"] == 1


def test_a_one_sample_server_gets_n_seeded_requests_reduced_here(toy_policy):
    one = OpenPIPolicy(toy_policy.model, validate({"openpi_samples_per_request": 1}), notice=toy_policy.notice)
    assert one.metadata()["policy_server_config"]["samples_per_request"] == 1
    with serving(one) as server:
        engine = remote_engine(server.url)
        try:
            assert engine.samples_per_request == 1
            here, there = serve_both(toy_policy.model, engine, count=4)
        finally:
            engine.stop()
        assert server.server.counts["replies"] == 4 and server.server.counts["requests"] == 4
    assert there.seeds == here.seeds
    assert there.metrics["remote_sample_requests"] == 4
    # Candidate i drawn alone from seeds[i] is the batched group's candidate i (bitwise for the toy policy on CPU),
    # and the local reduction is the engine's own code.
    assert_bitwise(here, there)


def test_the_local_and_the_remote_model_are_both_served_models(toy_policy):
    # What a face reads of its model is the ServedModel protocol, whole, on both; the remote imitates no pipeline.
    members = {*ServedModel.__annotations__, *(name for name in vars(ServedModel) if not name.startswith("_"))}
    remote = RemoteModel(validate({"engine": "openpi", "engine_url": "ws://127.0.0.1:9"}, env={}))
    for model in (toy_policy.model, remote):
        assert sorted(name for name in members if not hasattr(model, name)) == [], type(model).__name__
    assert not hasattr(remote, "pipe") and not hasattr(remote, "novelty")
    assert remote.remote_status()["url"] == "ws://127.0.0.1:9" and toy_policy.model.remote_status() is None
    assert remote.instrument(lambda adapter: adapter) is None and remote.count_tokens is None


@pytest.mark.parametrize("cut", [0.0, 2.0])
def test_a_remote_node_reduces_its_one_sample_groups_at_its_mode_threshold(cut):
    # Three close samples and one far off, reduced here by the engine's completion with the reducer the local model
    # would use: the relative rule leaves the far one out; the node's mode_threshold 2.0 holds all four in one mode.
    p = validate({"engine": "openpi", "engine_url": "ws://127.0.0.1:9", "mode_threshold": cut}, env={})
    request = build_request(RemoteModel(p), p, prompt="go", spec=CandidateTrajectorySpec(count=4, reducer="mode"),
                            base_seed=1, image=toy_image(), request_id="g", context=None)
    samples = [np.full((p.chunk_size, p.action_dim), value, np.float32) for value in (0.0, 0.01, 0.02, 1.0)]
    action = reduce_samples(request, samples, extra_metrics={}).action
    group = torch.from_numpy(np.stack(samples))
    assert torch.equal(action, configured_reducer("mode", cut or None)(group).float())
    one_mode = torch.allclose(action, group.mean(dim=0))
    assert one_mode == bool(cut) and torch.allclose(action, configured_reducer("mode")(group)) != bool(cut)


def test_a_one_sample_server_refuses_a_larger_count_with_the_count_error(toy_policy):
    one = OpenPIPolicy(toy_policy.model, validate({"openpi_samples_per_request": 1}), notice=toy_policy.notice)
    with serving(one) as server:
        engine = remote_engine(server.url)
        try:
            connection = engine_connection(engine)
            with pytest.raises(Exception) as caught:
                connection.request({"observation/image": toy_image(), "num_candidates": 2}, timeout_s=60,
                                   request_id="x")
            assert caught.value.code == ErrorCode.CANDIDATE_COUNT_ABOVE_MAX
        finally:
            engine.stop()


def engine_connection(engine: RemoteModel):
    from trajectory_ensemble_node.remote import open_connection
    return open_connection(engine.url, api_key=None, timeout_s=10)


def test_no_server_is_remote_unreachable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    engine = RemoteModel(validate({"engine": "openpi", "engine_url": f"ws://127.0.0.1:{port}",
                                    "engine_timeout_s": 5.0}))
    with pytest.raises(RemoteUnreachableError) as caught:
        engine.start()
    assert caught.value.code == ErrorCode.REMOTE_UNREACHABLE
    assert engine.remote_status()["state"] in ("reconnecting", "unreachable")


def test_a_server_that_does_not_fit_is_a_schema_error(toy_policy):
    with serving(toy_policy) as server:
        engine = RemoteModel(validate({"engine": "openpi", "engine_url": server.url, "chunk_size": 16}))
        with pytest.raises(RemoteSchemaError, match=r"action_shape is \[8, 2\] there but \[16, 2\] here"):
            engine.start()


def test_a_wrong_key_is_unreachable_with_the_servers_refusal(toy_policy, monkeypatch):
    monkeypatch.setenv("TE_TEST_KEY", "wrong")
    with serving(toy_policy, api_key="right") as server:
        engine = RemoteModel(validate({"engine": "openpi", "engine_url": server.url,
                                        "engine_api_key_env": "TE_TEST_KEY"}))
        with pytest.raises(RemoteUnreachableError, match="401"):
            engine.start()
        monkeypatch.setenv("TE_TEST_KEY", "right")
        engine = remote_engine(server.url, engine_api_key_env="TE_TEST_KEY")
        engine.stop()


def start_paced_group(toy_policy, paced, server, engine: RemoteModel, **kwargs: Any):
    paced(1.0)  # 10 steps of 1 s: the group is in the engine for about 10 s
    handle = engine.submit_request(engine.make_request(**group_kwargs(engine.params, **kwargs)))
    wait_until(lambda: server.server.stats()["in_engine"] == 1, what="the remote group in the engine")
    return handle


def test_cancel_closes_the_request_and_the_server_cancels_its_group(toy_policy, paced):
    with serving(toy_policy) as server:
        engine = remote_engine(server.url)
        try:
            handle = start_paced_group(toy_policy, paced, server, engine)
            assert handle.cancel()
            with pytest.raises(GroupCanceledError):
                handle.result(timeout=60)
            wait_until(lambda: server.server.counts["canceled_on_disconnect"] == 1, what="the server's cancel")
        finally:
            engine.stop()


def test_a_connection_dropped_mid_request_is_remote_disconnected(toy_policy, paced):
    with serving(toy_policy) as server:
        engine = remote_engine(server.url)
        try:
            handle = start_paced_group(toy_policy, paced, server, engine)
            loop = server._loop
            for ws in list(server.server._connections):  # the network fails: no close frame, no error frame
                loop.call_soon_threadsafe(ws.transport.abort)
            with pytest.raises(RemoteDisconnectedError) as caught:
                handle.result(timeout=60)
            assert caught.value.code == ErrorCode.REMOTE_DISCONNECTED
        finally:
            engine.stop()


def test_a_reply_slower_than_its_bound_is_remote_timeout(toy_policy, paced):
    with serving(toy_policy) as server:
        engine = remote_engine(server.url, engine_timeout_s=3.0)
        try:
            handle = start_paced_group(toy_policy, paced, server, engine)
            with pytest.raises(RemoteTimeoutError) as caught:
                handle.result(timeout=60)
            assert caught.value.code == ErrorCode.REMOTE_TIMEOUT
            # The timed-out request's connection was closed: the server canceled its group.
            wait_until(lambda: server.server.counts["canceled_on_disconnect"] == 1, what="the server's cancel")
        finally:
            engine.stop()


def test_engine_parameters_are_checked(monkeypatch):
    from trajectory_ensemble_node.errors import ParameterError
    with pytest.raises(ParameterError, match="engine_url: 'http://x:1' must be a ws://HOST:PORT"):
        validate({"engine": "openpi", "engine_url": "http://x:1"})
    with pytest.raises(ParameterError, match="engine: 'ray' is not one of"):
        validate({"engine": "ray"})
    monkeypatch.delenv("TE_UNSET_KEY", raising=False)
    with pytest.raises(ParameterError, match="engine_api_key_env: the environment variable 'TE_UNSET_KEY'"):
        validate({"engine": "openpi", "engine_url": "ws://127.0.0.1:1", "engine_api_key_env": "TE_UNSET_KEY"})
    with pytest.raises(ParameterError, match="enable_weight_updates: weights are updated on the remote server"):
        validate({"engine": "openpi", "engine_url": "ws://127.0.0.1:1", "enable_weight_updates": True,
                  "weights_dir": "/tmp"})
    with pytest.raises(ParameterError, match="openpi_samples_per_request: must be >= 0"):
        validate({"openpi_samples_per_request": -1})
    with pytest.raises(ParameterError, match="engine_timeout_s: must be > 0"):
        validate({"engine_timeout_s": 0.0})
    assert validate({}).engine == "local"
    monkeypatch.setenv("TE_SET_KEY", "k")
    assert validate({"engine": "openpi", "engine_url": "wss://gpu.example:443",
                     "engine_api_key_env": "TE_SET_KEY"}).engine_url == "wss://gpu.example:443"


def test_the_prober_sees_the_server_go_and_come_back_on_the_same_port(toy_policy, monkeypatch):
    from trajectory_ensemble_node.openpi import OpenPIServer, ServerLimits, ServerThread
    from trajectory_ensemble_node.remote import model as remote_module

    monkeypatch.setattr(remote_module, "PROBE_EVERY_S", 0.2)  # the states, not the production cadence, are tested
    with serving(toy_policy) as server:
        port = server.port
        engine = remote_engine(server.url)
    try:
        wait_until(lambda: engine.remote_status()["state"] in ("reconnecting", "unreachable"), what="the server gone")
        wait_until(lambda: engine.remote_status()["state"] == "unreachable", what="three failed probes")
        back = ServerThread(OpenPIServer(toy_policy, ServerLimits(), port=port)).start()
        try:
            wait_until(lambda: engine.remote_status()["state"] == "connected", what="the server back")
            status = engine.remote_status()
            assert status["failures"] == 0 and status["round_trip_ms"] is not None
            assert status["server"] == "trajectory_ensemble" and status["weights_version"] == 0
            here, there = serve_both(toy_policy.model, engine, count=2, request_id="after-restart")
            assert torch.equal(here.action, there.action)
        finally:
            back.stop()
    finally:
        engine.stop()


def test_the_goal_feedback_stages_reach_the_progress_callback(toy_policy):
    events: list = []
    with serving(toy_policy) as server:
        engine = remote_engine(server.url)
        try:
            kwargs = {**group_kwargs(engine.params, count=1, reducer="none"), "on_progress": events.append}
            engine.wait(engine.submit_request(engine.make_request(**kwargs)), timeout=120)
        finally:
            engine.stop()
    assert [(e.stage, e.step, e.total_steps) for e in events] == [("queued", 0, 10), ("denoising", 0, 10),
                                                                  ("reducing", 10, 10)]
