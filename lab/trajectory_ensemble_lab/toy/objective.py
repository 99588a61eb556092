"""The objective and the optimizer loop of ``train-toy``: the shared trainer's (:mod:`..training.fit`).

The conventions (noisy tokens, velocity target, timestep, vision term, prefixes, drift, retiming) are those the
serving path integrates; :mod:`.train`'s docstring gives them. :func:`fit` is one training run on one encoded
dataset; ``train-toy`` runs it once, DAgger (:mod:`.dagger`) once per round. The toy's augmentations are options
of that one objective, so this module only names it for the toy's callers.
"""

from __future__ import annotations

from ..training.fit import fit, sample_sigmas, training_loss

__all__ = ["fit", "sample_sigmas", "training_loss"]
