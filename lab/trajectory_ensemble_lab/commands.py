"""The lab's ``trajectory-ensemble`` commands, one table: command -> (module, help).

``trajectory_ensemble_node.cli`` finds this table through the ``trajectory_ensemble.commands`` entry point
(``lab/pyproject.toml``) and imports a module only when its command runs. Each module exposes
``add_arguments(parser)`` and ``run(args) -> int``. This file imports nothing when imported, so listing commands stays
cheap.
"""

from __future__ import annotations

COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("trajectory_ensemble_lab.bench.cli",
              "measurements: batched vs sequential (default) and the modes --quality, --closed-loop, --ros, ..."),
    "bench-steps": ("trajectory_ensemble_lab.toy.steps",
                    "collision rate against denoising steps on the toy task, and half-time deadlines"),
    "train-toy": ("trajectory_ensemble_lab.toy.train", "train the toy bimodal obstacle policy on CPU"),
    "train-pusht": ("trajectory_ensemble_lab.pusht.train_cli",
                    "train the PushT policy on the expert's demonstration bags (the shared trainer), on CPU"),
    "train-grpo": ("trajectory_ensemble_lab.grpo.train",
                   "Flow-GRPO fine-tuning of the toy policy from its own rollout groups (in process or --ros)"),
    "pusht-demos": ("trajectory_ensemble_lab.pusht.cli",
                    "PushT expert demonstrations on gym-pusht as rosbag2, with their seeds and multimodality"),
    "pusht-eval": ("trajectory_ensemble_lab.pusht.evaluate",
                   "closed-loop PushT episodes through the OpenPI wire (openpi-client) or its policy in process"),
    "code-sizes": ("trajectory_ensemble_lab.code_sizes",
                   "the product's Python lines and files per folder at two commits (bench/results/code-sizes.md)"),
    "pusht-oracle": ("trajectory_ensemble_lab.pusht.oracle_cli",
                     "the PushT state oracle (lab only): train it, and measure the product's reducers on it"),
    "pusht-dagger": ("trajectory_ensemble_lab.pusht.dagger",
                     "a DAgger round for the PushT policy: the expert takes over from the states its episodes reach"),
    "pusht-encoder": ("trajectory_ensemble_lab.pusht.encoder",
                      "train the PushT pipeline's VAE encoder to read the agent and the T (lab readout), gate it"),
}


def run_command(command: str, argv: list[str] | None = None) -> int:
    """``python -m <module> ARGS``, the same as ``trajectory-ensemble COMMAND ARGS``: one parser, built by the CLI.

    Args:
        command (`str`): A key of :data:`COMMANDS`.
        argv (`list[str]`, *optional*): The arguments after the command (default: ``sys.argv[1:]``).
    """
    import sys

    from trajectory_ensemble_node.cli.dispatch import main

    if command not in COMMANDS:
        raise ValueError(f"no lab command {command!r}; the commands are {sorted(COMMANDS)}")
    return main([command, *(sys.argv[1:] if argv is None else argv)])
