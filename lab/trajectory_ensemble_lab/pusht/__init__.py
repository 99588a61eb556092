"""PushT (``gym_pusht/PushT-v0`` from ``gym-pusht`` 0.1.8, used unchanged): a scripted expert and its demonstrations.

Seed ranges (gym-pusht reset seeds), kept apart so that no choice is made on the starts a policy is measured on:

- demonstrations: ``DEMO_SEED_BASE`` (0) .. 99 999;
- validation (the expert's settings, and later the policy's): ``VALIDATION_SEED_BASE`` (100 000) and up;
- held-out evaluation: ``HELDOUT_SEED_BASE`` (200 000) and up, measured once, after the choices are committed.

Only the lab imports ``gym_pusht``; the product's wheel never does.
"""

from __future__ import annotations

from trajectory_ensemble_node.bundled import PUSHT_INSTRUCTION

DEMO_SEED_BASE = 0
VALIDATION_SEED_BASE = 100_000
HELDOUT_SEED_BASE = 200_000
INSTRUCTION = PUSHT_INSTRUCTION
"""The instruction every PushT demonstration carries (and a PushT policy is conditioned on): the bundled policy's."""
