"""The observation-embedding tap and the novelty metrics on the real serving path (issue 33), toy policy on CPU.

Off (no scorer): nothing of it runs, and a group's result and scores are exactly what they were before the feature.
On: the same result bit for bit, plus the embedding the scorer reads (the one ``observation_embedding`` gives
``calibrate``) and its novelty score in the metrics.
"""

from __future__ import annotations

import pytest
import torch

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.engine.adapter import OBSERVATION_EMBEDDING
from trajectory_ensemble_node.errors import NoveltyScorerError
from trajectory_ensemble_node.models.cosmos3 import EMBEDDING_NAME, Cosmos3ActionModel, embedding_dim
from trajectory_ensemble_node.novelty import EmbeddingSpec, fit_scorer
from trajectory_ensemble_node.toy import load_toy_pipeline, request_kwargs, task
from trajectory_ensemble_lab.toy.shifted import render_shifted, shifted_scenes
from trajectory_ensemble_node.uncertainty import AlarmRule, NoveltyCheck, estimate_uncertainty

NOVELTY_KEYS = {"novelty_score", "novelty_threshold", "novel", "uncertainty_rule"}
SPEC = CandidateTrajectorySpec(count=4, reducer="mode", return_candidates=True)


@pytest.fixture(scope="module")
def model():
    return Cosmos3ActionModel(load_toy_pipeline())


def _embedding(model, image, grid=2):
    return model.observation_embedding(prompt=task.INSTRUCTION, action=request_kwargs(image)["action"], fps=task.FPS,
                                       guidance_scale=task.GUIDANCE_SCALE, grid=grid)


@pytest.fixture(scope="module")
def check(model):
    images = [task.render(s) for s in task.heldout_scenes(6, seed=900)]
    embeddings = torch.stack([_embedding(model, image) for image in images])
    spec = EmbeddingSpec(EMBEDDING_NAME, 2, embedding_dim(int(model.pipe.vae.config.z_dim), 2))
    return NoveltyCheck(fit_scorer("knn", embeddings, spec), AlarmRule("novelty", 0.04, 1.0))


def test_without_a_scorer_results_and_scores_are_exactly_as_before(model, check):
    image = task.render(task.make_scene(task.HELDOUT_SEED_BASE + 77))
    model.novelty = None
    request = model.make_request(**request_kwargs(image), spec=SPEC, base_seed=5)
    assert request.novelty is None and request.payload.embedding_grid is None  # the tap is not even asked
    off = model.wait(model.submit_request(request))
    # The engine's uncertainty entries are what estimate_uncertainty gives (what the engine computed before).
    expected = estimate_uncertainty(off.candidates).report(model.uncertainty_threshold).as_metrics()
    assert {k: off.metrics[k] for k in expected} == expected
    assert not NOVELTY_KEYS & set(off.metrics) and OBSERVATION_EMBEDDING not in off.metrics
    model.novelty = check
    try:
        on = model.generate(**request_kwargs(image), spec=SPEC, base_seed=5)
    finally:
        model.novelty = None
    # The tap reads features the pass has anyway: the served chunk and candidates do not change by a bit.
    assert torch.equal(on.action, off.action) and torch.equal(on.candidates, off.candidates)
    assert all(on.metrics[k] == off.metrics[k] for k in expected if k != "uncertain")


def test_with_a_scorer_the_metrics_score_the_embedding_calibrate_sees(model, check):
    normal = task.render(task.make_scene(task.HELDOUT_SEED_BASE + 78))
    shifted = render_shifted(shifted_scenes(1, seed=900)[0])
    model.novelty = check
    try:
        results = [model.generate(**request_kwargs(image), spec=SPEC, base_seed=6) for image in (normal, shifted)]
    finally:
        model.novelty = None
    for image, result in zip((normal, shifted), results):
        embedding = _embedding(model, image)
        assert embedding.shape == (64,)  # z_dim 16 x 2 x 2
        assert result.metrics["novelty_score"] == pytest.approx(check.scorer.score(embedding), rel=1e-6)
        assert result.metrics["uncertainty_rule"] == "novelty" and result.metrics["novelty_threshold"] == 1.0
        assert result.metrics["uncertain"] is result.metrics["novel"]
    assert results[1].metrics["novelty_score"] > results[0].metrics["novelty_score"]


def test_a_scorer_fitted_on_another_embedding_is_refused():
    pipe = load_toy_pipeline()
    grid3 = fit_scorer("knn", torch.randn(5, 16 * 9), EmbeddingSpec(EMBEDDING_NAME, 3, 16 * 9))
    served = Cosmos3ActionModel(pipe, novelty=NoveltyCheck(grid3, AlarmRule("novelty", None, 1.0)))  # grid 3 fits
    assert served.make_request(**request_kwargs(task.render(task.make_scene(1))), spec=SPEC).payload.embedding_grid == 3
    other = fit_scorer("knn", torch.randn(5, 10), EmbeddingSpec(EMBEDDING_NAME, 2, 10))
    with pytest.raises(NoveltyScorerError, match="length 10 .* embedding is 'conditioning_latent' of length 64"):
        Cosmos3ActionModel(load_toy_pipeline(), novelty=NoveltyCheck(other, AlarmRule("novelty", None, 1.0)))
