"""The loop (installed as ``agentgym.algorithms.loop``): what turns episodes into updates and steps into a run.

The update: :mod:`.batch` (trajectories -> tensors), :mod:`.learner` (the update loop, top to bottom) +
:mod:`.learner_state` + :mod:`.learner_config` (what every learner's config shares), :mod:`.optim` (the
one optimizer config for RL, SFT and DPO), :mod:`.parallel` (DDP, FSDP2) over :mod:`.distributed`.
The run: :mod:`.train_config` (TrainConfig, EvalConfig), :mod:`.trainer` (the run loop) + :mod:`.events`
(what a run tells its subscribers) + :mod:`.run_control` (checkpoints, Ctrl-C, resume) +
:mod:`.held_out` (the evals' tasks and settings) + :mod:`.overlap` + :mod:`.group_filter` +
:mod:`.health` + :mod:`.curves`. It may import :mod:`agentgym.algorithms.maths`, never
:mod:`agentgym.algorithms.compare` (tests/test_layers.py reads the imports). The public names are stated
in :mod:`agentgym.algorithms`.
"""
