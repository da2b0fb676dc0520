"""The GRPO family's program plan: everything a job compiles, built once,
from arrays for a run and from shapes for a compile-only check
(`jobs/grpo.py` consumes it both ways)."""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
from typing import Any

from flax import nnx
import jax

from tunix_pw.models import checkpoints
from tunix_pw.rl import loss as loss_lib
from tunix_pw.runtime import meshes as meshes_lib, reshard
from tunix_pw.runtime.sharding import Sharder
from tunix_pw.train import program


def total_updates(config: Any) -> int:
  """Optimizer updates over the run (the schedule's span)."""
  rl = config.rl
  samples = rl.prompts_per_step * rl.num_generations
  return config.steps * rl.num_iterations * (samples // rl.mini_batch_size)


def make_logps(config: Any, mesh, graphdef):
  """jitted (params state, sequences) -> per-token log-probabilities, on
  `mesh`."""
  shard = Sharder(mesh, config.sharding)
  return jax.jit(lambda state, b: loss_lib.token_logps(
      nnx.merge(graphdef, state), b['tokens'], b['positions'],
      b['segment_ids'], shard)[0])


def needed_keys(rl: Any) -> tuple[str, ...]:
  """The per-token arrays an update needs beyond the rollout's: the
  reference's log-probabilities (for the KL term), the trainer's at rollout
  time (when a rollout feeds several updates, to compare with the rollout
  engine's, or for PPO's KL reward penalty), and truncated importance
  weights."""
  samples = rl.prompts_per_step * rl.num_generations
  kl_reward = rl.kl_beta and rl.get('kl_in_reward', False)  # PPO's
  return (('ref_logps',) if rl.kl_beta else ()) + (
      ('old_logps',) if rl.num_iterations > 1 or rl.mini_batch_size < samples
      or rl.tis_cap or rl.mismatch_metrics or kl_reward else ()) + (
          ('tis_weights',) if rl.tis_cap else ())


@dataclasses.dataclass(frozen=True)
class Plan:
  """Everything the job compiles, for its run and its compile-only check
  alike: the policy and its train step, the rollout engine's shardings, the
  weight sync's budget and the log-probability programs."""

  policy: program.Program
  rollout_shardings: Any  # the whole model's, on the rollout mesh
  sync: reshard.Budget  # --config.runtime.reshard_group_mib, max_inflight
  needed: tuple[str, ...]  # the per-token arrays an update needs
  logps: Callable[[Any], Any]  # mesh -> its jitted log-probability program


def plan(config: Any, meshes: meshes_lib.RoleMeshes, *,
         abstract: bool) -> Plan:
  rl, actor = config.rl, meshes['actor']
  policy = program.build(
      config, actor, functools.partial(
          loss_lib.rl_loss, rl=rl, shard=Sharder(actor, config.sharding)),
      micro_batches=rl.mini_batch_size // rl.micro_batch_size,
      total_updates=total_updates(config), abstract=abstract)
  return Plan(policy, checkpoints.param_shardings(
      nnx.state(policy.model()), meshes['rollout'], config.sharding),
              reshard.Budget.from_block(config.runtime), needed_keys(rl),
              functools.cache(lambda mesh: make_logps(
                  config, mesh, policy.full_graphdef)))
