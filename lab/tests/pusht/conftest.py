"""The PushT tests' one expensive thing, played once per session: both expert seeds on start 10 (the committed bag's
start), with the env's frames. About 5 s on a loaded core."""

from __future__ import annotations

import pytest

from trajectory_ensemble_lab.pusht.recording import TEST_BAG_START


@pytest.fixture(scope="session")
def pusht_pair():
    """``[Episode(10, expert 0), Episode(10, expert 1)]`` with frames: two successes that go around the T in
    different ways."""
    from trajectory_ensemble_lab.pusht.demos import run_episode

    env_seed, expert_seeds = TEST_BAG_START
    return [run_episode(env_seed, e, frames=True) for e in expert_seeds]
