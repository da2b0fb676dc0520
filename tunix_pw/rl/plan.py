"""The GRPO family's program plan: everything a job compiles, built once,
from arrays for a run and from shapes for a compile-only check
(`rl/trainer.py` consumes it both ways), and the compile-only phases of its
batches, rollout, weight sync and on-policy distillation's teacher."""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
from typing import Any

from flax import nnx
import jax
import numpy as np

from tunix_pw.models import blocks, checkpoints, value
from tunix_pw.rl import batch as batch_lib, functions, judge, loss as loss_lib
from tunix_pw.rl import phases, reward_model
from tunix_pw.runtime import meshes as meshes_lib, reshard
from tunix_pw.runtime.sharding import Sharder
from tunix_pw.sampling.rollout import SamplingConfig
from tunix_pw.train import distill_losses, plans, program, scoring
from tunix_pw.train import step as step_lib


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
      b['segment_ids'], shard, config.rl.temperature,
      config.rl.logits_chunk, images=b.get('images'))[0])


def from_teacher(rl: Any) -> bool:
  """Whether the advantages are on-policy distillation's: from a
  teacher's scores, computed on the reference role."""
  source = functions.token_advantage(rl.advantage)
  return source is not None and source.scorer == 'teacher'


def whole_distributions(config: Any) -> bool:
  """Whether on-policy distillation adds the divergence of the teacher's
  and the student's whole next-token distributions (`distill.weight`)."""
  return (from_teacher(config.rl) and 'distill' in config
          and config.distill.weight > 0)


def make_teacher(config: Any, mesh, graphdef):
  """jitted (teacher state, sequences) -> on-policy distillation's teacher
  outputs on `mesh`: its log-probabilities of the sampled tokens
  (`ref_logps`) and, for `whole_distributions`, its logits (top-k), from
  `rl.logits_chunk` positions of its logits at a time."""
  shard = Sharder(mesh, config.sharding)
  whole = whole_distributions(config)

  def reduce(logits, targets):
    logp = loss_lib.logp_entropy(logits, targets, config.rl.temperature)[0]
    return (logp, distill_losses.teacher_outputs(
        logits, config.distill.top_k)) if whole else (logp,)

  def outputs(state, b):
    logp, *whole = step_lib.next_token_stats(
        nnx.merge(graphdef, state), b['tokens'], b['positions'],
        b['segment_ids'], reduce, shard=shard, chunk=config.rl.logits_chunk)
    return dict(ref_logps=logp[:, :-1], **(whole[0] if whole else {}))

  return jax.jit(outputs)


def teacher_shapes(config: Any, count: int
                   ) -> dict[str, tuple[tuple[int, ...], Any]]:
  """The teacher's logits (top-k) that `count` rows train on, as shapes."""
  if not whole_distributions(config):
    return {}
  rl, k = config.rl, config.distill.top_k
  rows = (count, rl.max_prompt_length + rl.max_new_tokens,
          k or blocks.architecture(config.teacher).vocab_size)
  return {'teacher_logits': (rows, np.float32),
          **({'teacher_indices': (rows, np.int32)} if k else {})}


def needed_keys(rl: Any) -> tuple[str, ...]:
  """The per-token arrays an update needs beyond the rollout's: the
  reference's log-probabilities (for the KL term, or a token advantage's
  scorer's), the trainer's at rollout time (when a rollout feeds several
  updates, to compare with the rollout engine's, for PPO's KL reward
  penalty, or for a token advantage), and importance weights (TIS or
  MIS)."""
  samples = rl.prompts_per_step * rl.num_generations
  kl_reward = rl.kl_beta and rl.get('kl_in_reward', False)  # PPO's
  source = functions.token_advantage(rl.advantage)
  needs = source.needs if source else ()
  return (('ref_logps',) if rl.kl_beta or 'ref_logps' in needs else ()) + (
      ('old_logps',) if rl.num_iterations > 1 or rl.mini_batch_size < samples
      or importance_weighted(rl) or rl.mismatch_metrics or kl_reward
      or 'old_logps' in needs else ()) + (
          ('is_weights',) if importance_weighted(rl) else ())


def importance_weighted(rl: Any) -> bool:
  """Whether each token's loss carries an importance weight of the trainer's
  against the rollout engine's probabilities (TIS or MIS)."""
  return bool(rl.tis_cap or rl.mis_threshold)


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
          loss_lib.rl_loss, rl=rl, distill=config.get('distill'),
          shard=Sharder(actor, config.sharding)),
      micro_batches=rl.mini_batch_size // rl.micro_batch_size,
      total_updates=total_updates(config), abstract=abstract)
  return Plan(policy, checkpoints.param_shardings(
      nnx.state(policy.model()), meshes['rollout'], config.sharding),
              reshard.Budget.from_block(config.runtime), needed_keys(rl),
              functools.cache(lambda mesh: make_logps(
                  config, mesh, policy.full_graphdef)))


def batch_shapes(config: Any, count: int, mesh: Any,
                 keys: tuple[str, ...] | None = None,
                 token_names: tuple[str, ...] = ()) -> dict[str, Any]:
  """`count` rows of the arrays a step trains on (all, with any teacher
  logits, or `keys`; and the per-token float arrays `token_names`), as
  shapes split over `mesh` like the run's."""
  rl = config.rl
  length = rl.max_prompt_length + rl.max_new_tokens
  group = batch_lib.Group([0], '', [[0]] * rl.num_generations,
                          [False] * rl.num_generations,
                          np.zeros(rl.num_generations), {},
                          [[0.0]] * rl.num_generations)
  arrays = batch_lib.to_arrays([group], [1.0], length, 0,
                               functions.group_advantage(rl.advantage))
  shapes = {k: ((count,) + v.shape[1:], v.dtype) for k, v in arrays.items()
            if keys is None or k in keys}
  shapes.update({k: ((count, length - 1), np.float32) for k in token_names})
  if keys is None:
    shapes.update(teacher_shapes(config, count))
  return plans.batch_on(mesh, config.sharding, shapes)


def rollout_phase(config: Any, rollout_model: Any,
                  rollout_mesh: Any) -> plans.Phase:
  """The rollout engine's program for one step's samples."""
  rl = config.rl
  return plans.generation_phase(
      'rollout', 'rollout', rollout_model, rollout_mesh, config.sharding,
      rl.prompts_per_step, rl.max_prompt_length, dataclasses.replace(
          phases.sampling(rl), generations=rl.num_generations),
      rl.decode_chunk)


def evaluation_phases(config: Any, rollout_model: Any,
                      rollout_mesh: Any) -> list[plans.Phase]:
  """The held-out evaluation's generation on the rollout engine: greedy
  and, with --config.eval_k, sampled; prompts up to the rollout's length."""
  rl = config.rl
  if not config.eval_examples:
    return []
  greedy = SamplingConfig(max_new_tokens=rl.max_new_tokens, greedy=True)
  return [plans.generation_phase(
      name, 'rollout', rollout_model, rollout_mesh, config.sharding,
      config.eval_batch_size, rl.max_prompt_length, sampling, rl.decode_chunk,
      per_step=0) for name, sampling in [('evaluation', greedy)] + (
              [('sampled evaluation', dataclasses.replace(
                  phases.sampling(rl, config.seed),
                  temperature=config.eval_temperature))]
              if config.eval_k else [])]


def scorer_phases(config: Any, meshes: meshes_lib.RoleMeshes,
                  resident: dict[str, dict[str, int]]
                  ) -> list[plans.Phase]:
  """The reward model's scores and the judge's greedy answers of a
  round's samples on the rollout mesh, their weights resident there."""
  rl, mesh, rules = config.rl, meshes['rollout'], config.sharding
  out = []
  if rl.reward_model:
    graphdef, state = nnx.split(value.abstract(rl.reward_model))
    state = plans.on_mesh(state, mesh, rules)
    score = reward_model.program(graphdef, mesh, rules)
    rows = batch_shapes(config, rl.logps_micro_batch_size, mesh,
                        phases.SEQUENCES)
    out.append(plans.Phase(
        'reward model', 'rollout', lambda: [score.lower(state, rows).compile()],
        resident_args=plans.per_device(state), bounded=True,
        per_step=logps_calls(config)))
  if rl.judge:
    out.append(plans.generation_phase(
        'judge', 'rollout', plans.abstract_frozen(
            judge.model_block(config), mesh, rules), mesh, rules,
        rl.prompts_per_step * rl.num_generations, rl.judge_max_prompt_length,
        judge.sampling(rl)))
  for phase in out:
    resident.setdefault('rollout', {})[phase.name] = phase.resident_args
  return out


def logps_calls(config: Any) -> float:
  """Calls per step of a program scoring a step's samples
  `logps_micro_batch_size` at a time."""
  rl = config.rl
  return rl.prompts_per_step * rl.num_generations / rl.logps_micro_batch_size


def teacher_phase(config: Any, meshes: meshes_lib.RoleMeshes,
                  resident: dict[str, dict[str, int]]) -> plans.Phase:
  """On-policy distillation's teacher: its log-probabilities of the
  samples (and logits) on the reference role's mesh, its weights resident
  there."""
  mesh, rules = scoring.reference_mesh(config, meshes), config.sharding
  teacher = plans.abstract_frozen(config.teacher, mesh, rules)
  phase = plans.logps_phase(
      'teacher logps', meshes, mesh, nnx.state(teacher), rules,
      lambda mesh, state: make_teacher(
          config, mesh, nnx.graphdef(teacher)).lower(
              state, batch_shapes(
                  config, config.rl.logps_micro_batch_size, mesh,
                  phases.SEQUENCES)))
  resident.setdefault(phase.role, {})['teacher'] = phase.resident_args
  return dataclasses.replace(phase, compile=lambda: phase.compile() + (
      plans.init_programs(config.teacher, config.seed, mesh, rules)))


def to_actor_transfer(config: Any, meshes: meshes_lib.RoleMeshes,
                      programs: Plan) -> plans.Transfer:
  """The log-probabilities (and a teacher's outputs) an update needs,
  from the mesh that computed them onto the actor's (`phases.to_actor`)."""
  rl, rules, actor = config.rl, config.sharding, programs.policy.mesh
  count = rl.prompts_per_step * rl.num_generations
  length = rl.max_prompt_length + rl.max_new_tokens - 1
  source = {k: scoring.reference_mesh(config, meshes) if k == 'ref_logps'
            else actor for k in programs.needed if k != 'is_weights'}
  shapes = {k: ((count, length), np.float32) for k in source}
  if from_teacher(rl):
    shapes.update(teacher_shapes(config, count))
    source.update({k: source['ref_logps'] for k in shapes})
  sources = {k: plans.batch_on(source[k], rules, {k: v})[k]
             for k, v in shapes.items()}
  targets = plans.batch_on(actor, rules, shapes)
  return plans.Transfer(
      'log-probabilities to actor', sources, targets, programs.sync,
      (next(r for r, m in meshes.by_role.items() if m is actor), 'actor'))
