"""One flow-matching trainer for Cosmos 3 policies on a recorded data set, shared by ``train-toy`` and ``train-pusht``.

- :mod:`.dataset`: training examples (a conditioning frame, an instruction, action chunks in the model's normalized
  units, optional target clips), encoded once with the serving path's own conditioning and VAE code;
- :mod:`.fit`: the objective (packed through the serving path's ``pack_forward``) and the optimizer loop with EMA;
- :mod:`.pipeline`: a fresh pipeline made trainable, and saving it (``save_pretrained``, safetensors).

A task supplies only its examples and its model shape: the toy renders its scenes (``toy/data.py``), PushT reads its
demonstration bags (``pusht/train.py``).
"""

from __future__ import annotations

from trajectory_ensemble_node.errors import ErrorCode, TrajectoryEnsembleError


class TrainingError(TrajectoryEnsembleError, ValueError):
    """A training setting or data set the trainer cannot use (the message quotes the bad value)."""

    code = ErrorCode.INVALID_PARAMETERS
