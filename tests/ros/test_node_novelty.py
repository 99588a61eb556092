"""Observation novelty over real DDS (issue 33): a node with a calibration file and its scorer reports
``novelty_score`` and ``novel`` in every result, and ``/diagnostics`` warns on a two-obstacle frame but not on a
normal one.

The calibration is made here the way ``calibrate`` makes it, only smaller: observation embeddings of in-distribution
toy scenes (``Cosmos3ActionModel.observation_embedding``, the value a serving group scores), a k-NN scorer fitted on
half of them, its split-conformal threshold from the other half, written as the scorer file and a calibrate JSON
whose recommended rule is ``novelty`` (the node's ``uncertainty_rule`` is left empty, so it takes the JSON's).
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import Stamps, serve_node, succeeded  # noqa: E402
from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402

from trajectory_ensemble_node.models.cosmos3 import EMBEDDING_NAME, Cosmos3ActionModel, embedding_dim  # noqa: E402
from trajectory_ensemble_node.novelty import EmbeddingSpec, fit_scorer  # noqa: E402
from trajectory_ensemble_node.stats import conformal_threshold  # noqa: E402
from trajectory_ensemble_node.toy import ACTION_SETTINGS, INSTRUCTION, load_toy_pipeline, request_kwargs, task  # noqa: E402
from trajectory_ensemble_node.toy.shifted import render_shifted, shifted_scenes  # noqa: E402
from trajectory_ensemble_node.uncertainty import ALARM_RULES  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

COUNT = 4
GRID = 2
stamps = Stamps(9000)


def _calibrate(tmp):
    """Scorer file, calibrate JSON, and one normal and one two-obstacle frame with their offline novelty scores."""
    model = Cosmos3ActionModel(load_toy_pipeline())

    def embed(image):
        return model.observation_embedding(prompt=INSTRUCTION, action=request_kwargs(image)["action"], fps=task.FPS,
                                           guidance_scale=task.GUIDANCE_SCALE, grid=GRID)

    scenes = task.heldout_scenes(60, seed=5000)
    embeddings = torch.stack([embed(task.render(s)) for s in scenes[:40]])
    spec = EmbeddingSpec(EMBEDDING_NAME, GRID, embedding_dim(int(model.pipe.vae.config.z_dim), GRID))
    scorer = fit_scorer("knn", embeddings[:20], spec)
    threshold = conformal_threshold([float(v) for v in scorer.scores(embeddings[20:])], 0.1)
    path = tmp / "toy.novelty.safetensors"
    digest = scorer.save(path)
    rules = {rule: {"spread_threshold": 1.0, "novelty_threshold": threshold} for rule in ALARM_RULES}
    calibration = tmp / "toy.json"
    calibration.write_text(json.dumps({
        "uncertainty": {"threshold": 1.0},
        "observation": {"threshold": threshold, "scorer_sha256": digest},
        "combined": {"rule": "novelty", "rules": rules},
    }))
    # Frames chosen with a margin on either side of the threshold, so float32 transport cannot flip them.
    normal = next((image, score) for image in (task.render(s) for s in scenes[40:])
                  if (score := scorer.score(embed(image))) < 0.8 * threshold)
    shifted = next((image, score) for image in (render_shifted(s) for s in shifted_scenes(30, seed=5000))
                   if (score := scorer.score(embed(image))) > 1.2 * threshold)
    return path, calibration, threshold, normal, shifted


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("node_novelty")
    scorer, calibration, threshold, normal, shifted = _calibrate(tmp)
    for node_and_client in serve_node(tmp, ros_domain_id, {
        **ACTION_SETTINGS, "model": "toy", "instruction": INSTRUCTION, "reducer": "mode", "candidate_count": COUNT,
        "uncertainty_calibration_file": str(calibration), "novelty_scorer_file": str(scorer),
        "max_observation_age_s": 120.0,
    }):
        yield node_and_client[1], threshold, normal, shifted


def test_a_two_obstacle_frame_is_novel_and_diagnostics_warn(served):
    client, threshold, _, (image, score) = served
    client.publish_rgb(image, stamps())
    result = succeeded(client.run_goal(use_seed=True, seed=3))
    u = result.uncertainty
    assert u.rule == "novelty" and u.window == 1
    assert u.novelty_score == pytest.approx(score, rel=1e-4) and u.novelty_threshold == pytest.approx(threshold)
    assert u.novel and result.uncertain
    status, values = client.latest_status("engine", predicate=lambda v: v.get("novel") == "true")
    assert status.level == DiagnosticStatus.WARN and "rule novelty: novelty" in status.message
    assert values["uncertainty_rule"] == "novelty"


def test_a_normal_frame_is_not_novel_and_diagnostics_are_ok(served):
    client, threshold, (image, score), _ = served
    client.publish_rgb(image, stamps())
    result = succeeded(client.run_goal(use_seed=True, seed=4))
    u = result.uncertainty
    assert u.novelty_score == pytest.approx(score, rel=1e-4) and u.novelty_score < threshold
    assert not u.novel and not result.uncertain and u.rule == "novelty"
    status, _ = client.latest_status("engine", predicate=lambda v: v.get("novel") == "false")
    assert status.level == DiagnosticStatus.OK
