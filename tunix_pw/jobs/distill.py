"""Distillation: SFT's loop (train/supervised.py) with a frozen teacher.

data -> the teacher's outputs on the teacher role's mesh -> moved to the
actor mesh by the runtime's reshard when the meshes differ -> train step:
sft_weight x the NLL of the data + weight x the strategy's loss ->
metrics -> greedy exact-match evaluation -> checkpoint -> preemption
check. Strategies (`distill.strategy`, registered in
train/distill_strategies.py, losses in train/distill_losses.py):

- logit: a divergence between the student's and the teacher's next-token
  distributions at temperature tau (forward KL, reverse KL, JSD), the
  teacher's logits whole or its top-k;
- attention: the attention maps of mapped layers (`distill.layers`,
  student:teacher pairs), heads averaged when their counts differ;
- feature: the outputs of mapped layers, the student's through a learned
  projection to the teacher's width (`distill_projection`, trained with
  the student, dropped from exports and from loads of the workdir), per
  token or mean-pooled per sequence.

The teacher is any model block (a checkpoint, a trained workdir, a preset)
of any family and size, reading the student's tokens: it must share the
student's tokenizer (checked at validation), and the layer map must fit
both models.
"""

from __future__ import annotations

import functools
from typing import Any

from flax import nnx
import jax
import numpy as np

from tunix_pw import registry
from tunix_pw.data import pipeline
from tunix_pw.errors import UsageError
from tunix_pw.models import blocks, checkpoints
from tunix_pw.rl import rewards
from tunix_pw.runtime import backend, meshes as meshes_lib, reshard, sharding
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.runtime.sharding import Sharder
from tunix_pw.train import distill_losses, distill_strategies, plans, program
from tunix_pw.train import scoring, setup, supervised

POOLING = ('token', 'mean')


def validate(config: Any) -> None:
  supervised.check(config)
  rewards.verifier(config.eval_verifier)
  checkpoints.check_model_block(config.teacher, '--config.teacher')
  d = config.distill
  registry.check('distill_strategy', d.strategy, '--config.distill.strategy')
  if d.pooling not in POOLING:
    raise UsageError(f'--config.distill.pooling={d.pooling!r} must be one '
                     f'of {", ".join(POOLING)}.')
  setup.check_logit_distillation(d)
  if d.sft_weight < 0 or d.weight + d.sft_weight == 0:
    raise UsageError('--config.distill.weight and sft_weight must be at '
                     'least 0, and not both 0.')
  setup.check_same_tokenizer(config.model, config.teacher)
  if distill_strategies.get(d.strategy).mapped:
    distill_losses.layer_map(config)
    if config.logits_chunk:
      raise UsageError(f'--config.logits_chunk={config.logits_chunk} cannot '
                       f'apply: the {d.strategy} strategy reads every '
                       "layer's internals with the logits whole (leave it "
                       '0).')


def plan(config: Any, meshes: meshes_lib.RoleMeshes, *,
         abstract: bool) -> program.Program:
  return supervised.plan(config, meshes, abstract=abstract,
                         loss=functools.partial(
                             distill_strategies.distill_loss, d=config.distill,
                             student_layers=distill_strategies.mapped_layers(
                                 config, 0), chunk=config.logits_chunk))


def teacher_mesh(meshes: meshes_lib.RoleMeshes) -> Any:
  return meshes['teacher'] if 'teacher' in meshes.by_role else meshes['actor']


def teacher_program(config: Any, graphdef: Any, mesh: Any):
  """Jitted (teacher state, batch) -> what the strategy compares, batch
  first: its logits [B, T, V] or top-k (values, token ids) [B, T, k]; the
  mapped layers' attention [B, layers, heads, T, T] or outputs [B, layers,
  T, D]."""
  shard, d = Sharder(mesh, config.sharding), config.distill
  layers = distill_strategies.mapped_layers(config, 1)

  def outputs(state, batch):
    return distill_strategies.get(d.strategy).teacher(
        *distill_strategies.forward(nnx.merge(graphdef, state), batch,
                                    layers, shard), d)

  return jax.jit(outputs)


def target_shapes(config: Any) -> dict[str, tuple[tuple[int, ...], Any]]:
  """The teacher's outputs for one batch of full rows, as shapes."""
  d = config.distill
  return distill_strategies.get(d.strategy).shapes(
      d, config.batch_size, config.data.max_length,
      blocks.architecture(config.teacher),
      len(distill_strategies.mapped_layers(config, 1)))


def compile_plan(config: Any, meshes: meshes_lib.RoleMeshes):
  """The student's train step on full `max_length` rows with the
  teacher's outputs (laid out as the run gets them), the teacher's forward
  pass on its mesh (its weights resident there) and, from another mesh,
  the outputs' move onto the actor's, from shapes."""
  policy = plan(config, meshes, abstract=True)
  rows = (config.batch_size, config.data.max_length)
  tokens = {k: (rows, np.int32)
            for k in ('tokens', 'positions', 'segment_ids', 'loss_mask')}
  rules, mesh = config.sharding, teacher_mesh(meshes)
  teacher = plans.abstract_frozen(config.teacher, mesh, rules)
  state = plans.on_mesh(nnx.state(teacher), mesh, rules)
  compiled = teacher_program(config, nnx.graphdef(teacher), mesh).lower(
      state, plans.batch_on(mesh, rules, tokens)).compile()
  phase = plans.Phase(
      'teacher outputs', next(r for r, m in meshes.by_role.items()
                              if m is mesh),
      lambda: [compiled] + plans.init_programs(
          config.teacher, config.seed, mesh, rules),
      resident_args=plans.per_device(state))
  resident = {'actor': program.resident(policy)}
  resident.setdefault(phase.role, {})['teacher'] = phase.resident_args
  outputs = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=s) for (
      k, (shape, dtype)), s in zip(sorted(target_shapes(config).items()),
                                   jax.tree.leaves(compiled.output_shardings))}
  targets = outputs if mesh is policy.mesh else plans.batch_on(
      policy.mesh, rules, target_shapes(config))
  return supervised.evaluation_plan(config, policy, plans.Plan(resident, [
      program.train_phase(policy, {**plans.batch_on(
          policy.mesh, rules, tokens), **targets}), phase], [] if (
              mesh is policy.mesh) else [plans.Transfer(
                  "the teacher's outputs", outputs, targets,
                  reshard.Budget.from_block(config.runtime),
                  (phase.role, 'actor'))]))


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  mesh, rules = meshes['actor'], config.sharding
  teacher = scoring.from_block(config.teacher, teacher_mesh(meshes), rules,
                               config.seed)
  outputs = teacher_program(config, teacher.graphdef, teacher.mesh)
  budget = reshard.Budget.from_block(config.runtime)

  def targets(host: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    out = outputs(teacher.state, pipeline.place(host, teacher.mesh, rules))
    if teacher.mesh is mesh:
      return out
    moved, _ = reshard.transfer(out, {
        k: sharding.batch(mesh, v.shape, rules) for k, v in out.items()},
                                runtime, budget=budget)
    return moved

  supervised.run(config, runtime, meshes, workdir, preemption,
                 name='distill', policy=plan(config, meshes, abstract=False),
                 targets=targets, evaluation=functools.partial(
                     supervised.exact_match, config,
                     rewards.verifier(config.eval_verifier)))
