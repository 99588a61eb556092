"""Flow-GRPO fine-tuning of the toy policy from its own rollout groups: :mod:`.train` (``train-grpo``, in process)
and :mod:`.ros` (the same loop through a running node's rollouts and ``~/update_weights``)."""
