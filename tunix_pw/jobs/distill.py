"""Distillation: SFT's loop (jobs/sft.py) with a frozen teacher.

data -> the teacher's logits on the teacher role's mesh (its top-k, or
all) -> moved to the actor mesh by the runtime's reshard when the meshes
differ -> train step: sft_weight x the NLL of the data + weight x a
divergence between the student's and the teacher's next-token
distributions at temperature tau (train/distill_losses.py) -> metrics ->
greedy exact-match evaluation -> checkpoint -> preemption check.

The teacher is any model block (a checkpoint, a trained workdir, a
preset), of any family and size; logit distillation needs the student's
tokenizer (checked at validation).
"""

from __future__ import annotations

import functools
from typing import Any

from flax import nnx
import jax
import numpy as np

from tunix_pw import compile_only
from tunix_pw.data import pipeline
from tunix_pw.errors import UsageError
from tunix_pw.jobs import sft
from tunix_pw.models import checkpoints
from tunix_pw.rl import registry
from tunix_pw.runtime import backend, meshes as meshes_lib, reshard, sharding
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.runtime.sharding import Sharder
from tunix_pw.train import distill_losses, program, scoring, setup
from tunix_pw.train import step as step_lib

# Text whose ids two tokenizers must agree on (with their vocabulary size
# and special ids) to be the same tokenizer.
PROBE = ''.join(chr(c) for c in range(32, 127)) + ' 12+30=42\nThe answer is'


def validate(config: Any) -> None:
  sft.validate(config)
  checkpoints.check_model_block(config.teacher, '--config.teacher')
  d = config.distill
  registry.check('distill_divergence', d.divergence,
                 '--config.distill.divergence')
  if d.temperature <= 0 or not 0 < d.beta < 1 or d.top_k < 0:
    raise UsageError(f'--config.distill.temperature={d.temperature} must be '
                     f'positive, beta={d.beta} in (0, 1) and top_k={d.top_k} '
                     'at least 0.')
  if d.weight < 0 or d.sft_weight < 0 or d.weight + d.sft_weight == 0:
    raise UsageError('--config.distill.weight and sft_weight must be at '
                     'least 0, and not both 0.')
  check_same_tokenizer(config)


def check_same_tokenizer(config: Any) -> None:
  """Logits compare token by token: the teacher must tokenize as the
  student does and share its vocabulary."""
  student, teacher = (setup.tokenizer(b) for b in (config.model,
                                                   config.teacher))
  sizes = [setup.architecture(b).vocab_size
           for b in (config.model, config.teacher)]
  same = (sizes[0] == sizes[1] and all(
      getattr(student, a) == getattr(teacher, a)
      for a in ('vocab_size', 'pad_id', 'bos_id', 'eos_id', 'stop_ids')) and
          student.encode(PROBE) == teacher.encode(PROBE))
  if not same:
    raise UsageError(
        f'the teacher ({setup.tokenizer_source(config.teacher)}, '
        f'{sizes[1]} logits) does not share the student\'s tokenizer '
        f'({setup.tokenizer_source(config.model)}, {sizes[0]} logits): '
        'logit distillation compares next-token distributions id by id.')


def distill_loss(model, batch, rng, *, divergence: str, beta: float,
                 tau: float, weight: float, sft_weight: float,
                 shard: Sharder = Sharder()):
  """sft_weight x NLL + weight x tau^2 x divergence, per target token."""
  del rng
  logits, _ = model(batch['tokens'], batch['positions'], batch['segment_ids'],
                    shard=shard)
  nll, mask, correct = step_lib.token_nll(logits, batch['tokens'],
                                          batch['loss_mask'],
                                          batch['segment_ids'])
  indices = batch.get('teacher_indices')
  log_s, log_t = distill_losses.log_probs(
      logits[:, :-1], batch['teacher_logits'][:, :-1],
      None if indices is None else indices[:, :-1], tau)
  kd = tau ** 2 * registry.get('distill_divergence', divergence)(
      log_s, log_t, beta)
  per_token = sft_weight * nll + weight * kd
  return (per_token * mask).sum(), dict(
      weight=mask.sum(), accuracy=(correct * mask).sum(),
      nll=(nll * mask).sum(), kd=(kd * mask).sum())


def plan(config: Any, meshes: meshes_lib.RoleMeshes, *,
         abstract: bool) -> program.Program:
  d = config.distill
  return sft.plan(config, meshes, abstract=abstract, loss=functools.partial(
      distill_loss, divergence=d.divergence, beta=d.beta, tau=d.temperature,
      weight=d.weight, sft_weight=d.sft_weight))


def teacher_mesh(meshes: meshes_lib.RoleMeshes) -> Any:
  return meshes['teacher'] if 'teacher' in meshes.by_role else meshes['actor']


def teacher_program(config: Any, graphdef: Any, mesh: Any):
  """Jitted (teacher state, batch) -> its logits [B, T, V], or its top-k
  (values, token ids) [B, T, k] with `distill.top_k`."""
  shard, k = Sharder(mesh, config.sharding), config.distill.top_k

  def outputs(state, batch):
    logits, _ = nnx.merge(graphdef, state)(
        batch['tokens'], batch['positions'], batch['segment_ids'],
        shard=shard)
    if k:
      values, indices = distill_losses.top_k(logits, k)
      return dict(teacher_logits=values, teacher_indices=indices)
    return dict(teacher_logits=logits)

  return jax.jit(outputs)


def compile_plan(config: Any, meshes: meshes_lib.RoleMeshes):
  """The student's train step on full `max_length` rows with the
  teacher's outputs, and the teacher's forward pass on its mesh (its
  weights resident there), from shapes."""
  policy = plan(config, meshes, abstract=True)
  rows = (config.batch_size, config.data.max_length)
  tokens = {k: (rows, np.int32)
            for k in ('tokens', 'positions', 'segment_ids', 'loss_mask')}
  width = config.distill.top_k or setup.architecture(config.model).vocab_size
  targets = {'teacher_logits': (rows + (width,), np.float32)}
  if config.distill.top_k:
    targets['teacher_indices'] = (rows + (width,), np.int32)
  rules = config.sharding
  teacher = compile_only.abstract_frozen(config.teacher, teacher_mesh(meshes),
                                         rules)
  resident = {'actor': program.resident(policy)}
  phase = compile_only.logps_phase(
      'teacher logits', meshes, teacher_mesh(meshes), nnx.state(teacher),
      rules, lambda mesh, state: teacher_program(
          config, nnx.graphdef(teacher), mesh).lower(
              state, compile_only.batch_on(mesh, rules, tokens)))
  resident.setdefault(phase.role, {})['teacher'] = phase.resident_args
  return compile_only.Plan(resident, [
      program.train_phase(policy, compile_only.batch_on(
          policy.mesh, rules, {**tokens, **targets})), phase])


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

  sft.run(config, runtime, meshes, workdir, preemption, name='distill',
          policy=plan(config, meshes, abstract=False), targets=targets)
