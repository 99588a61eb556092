"""The PushT expert against gym-pusht as published: it solves starts it is known to solve (by the env's own
coverage), its actions alone solve them again in a fresh env, and two expert seeds on one start take different
routes along different paths."""

from __future__ import annotations

import numpy as np
import pytest

from trajectory_ensemble_lab.pusht.demos import PATH_APART, multimodality, path_distance, run_episode
from trajectory_ensemble_lab.pusht.expert import ExpertRoute
from trajectory_ensemble_lab.pusht.sim import FACES, SUCCESS_COVERAGE, PushTSim, make_env, read_state

SHORT_START = (14, 1)
"""A start and expert seed solved in 55 steps (the demos test caps its twin, expert seed 0, below its 75)."""


def _replay(env_seed: int, actions: np.ndarray) -> dict:
    """The env's last ``info`` after sending ``actions`` from reset ``env_seed``, in a fresh env."""
    env = make_env()
    env.reset(seed=env_seed)
    for action in actions:
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    return info


def test_the_expert_solves_known_starts_by_the_envs_own_coverage(pusht_pair):
    short = run_episode(*SHORT_START)
    for ep in [*pusht_pair, short]:
        assert ep.success and ep.coverage > SUCCESS_COVERAGE, ep.summary()
        assert ep.steps == len(ep.agent_path) - 1 < 300
        # The absolute targets alone are the demonstration: sent to a fresh env from the same reset, they succeed.
        info = _replay(ep.env_seed, ep.actions)
        assert info["is_success"] and info["coverage"] > SUCCESS_COVERAGE
        # The same pose in two env instances can give coverages one ulp apart (seen: 0.96335371108370[36 vs 33]).
        assert info["coverage"] == pytest.approx(ep.coverage, abs=1e-12)
    assert short.steps == 55


def test_two_expert_seeds_on_one_start_take_different_routes_along_different_paths(pusht_pair):
    first, second = pusht_pair
    assert first.env_seed == second.env_seed and first.expert_seed != second.expert_seed
    assert isinstance(first.route, ExpertRoute) and first.route.face in FACES and first.route.side in ("cw", "ccw")
    assert first.route != second.route
    # Each route was one of the good ways to start that its seed drew from.
    assert first.route in first.routes_open and second.route in second.routes_open
    assert path_distance(first.agent_path, second.agent_path) >= PATH_APART
    figure = multimodality(pusht_pair)
    assert (figure["starts"], figure["different_routes"], figure["different_paths"], figure["share"]) == (1, 1, 1, 1.0)
    # The same episode twice is one mode, not two.
    same = multimodality([first, type(first)(**{**first.__dict__, "expert_seed": 7})])
    assert (same["different_routes"], same["different_paths"]) == (0, 0)


def test_the_private_sim_steps_exactly_as_the_env(pusht_pair):
    ep = pusht_pair[0]
    env = make_env()
    env.reset(seed=ep.env_seed)
    sim = PushTSim()
    start = read_state(env)
    sim.set_state(start)
    for action in ep.actions[:40]:  # the approach and the first push: contacts included
        env.step(action)
        sim.step(action)
    state = read_state(env)
    np.testing.assert_allclose(sim.block_pose(), state.block, atol=1e-9)
    np.testing.assert_allclose(sim.agent_position(), state.agent, atol=1e-9)
    assert np.linalg.norm(state.block[:2] - start.block[:2]) > 5.0  # the T was pushed on the way: contacts matched
