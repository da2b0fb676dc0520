"""GRPO and its variants (DAPO, Dr. GRPO, GSPO-token, CISPO, REINFORCE++,
on-policy distillation), one explicit loop.

Each step runs the phases of `tunix_pw/rl/phases.py`: rollout on the
rollout mesh (G generations each; DAPO refills groups whose rewards are all
equal) and rewards -> advantages -> reference and old log-probabilities ->
mini-batch updates on the actor mesh (gradient accumulation, num_iterations
reuses of the rollout) -> weight sync actor -> rollout (the runtime's
reshard) -> metrics; then evaluation and checkpoints, with preemption
checked at every phase boundary. The trainer is a library
(`rl/trainer.py`); this job builds its parts and runs its loop.
"""

from __future__ import annotations

from typing import Any

from tunix_pw.rl import config_checks, trainer
from tunix_pw.runtime import backend, meshes as meshes_lib
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.train import setup


validate = config_checks.validate  # the job's static checks
compile_plan = trainer.compile_plan


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  parts, heldout = trainer.build(config, runtime, meshes)
  state = trainer.train(parts, heldout, workdir, preemption,
                        parts.plan.policy.state, trainer.step)
  if config.export:
    setup.export(config, parts.plan.policy.model(state.params))
