"""DPO, IPO, ORPO and KTO: preference tuning, one explicit loop.

data (prompt, chosen, rejected; for KTO labelled examples, or pairs split
into a desirable and an undesirable example) -> reference log-probabilities
(frozen initial policy on the reference mesh; none for ORPO) -> train step
(gradient accumulation) -> metrics -> held-out pairwise accuracy ->
checkpoint -> preemption check.
"""

from __future__ import annotations

import functools
from typing import Any

from flax import nnx
import jax
import numpy as np

from tunix_pw import checks, registry
from tunix_pw.data import pipeline
from tunix_pw.errors import UsageError
from tunix_pw.models import blocks, checkpoints
from tunix_pw.runtime import backend, meshes as meshes_lib
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.runtime.sharding import Sharder
from tunix_pw.train import loop, metrics, optim, plans, preference, program
from tunix_pw.train import scoring, setup

SIDES = preference.PAIRED

def validate(config: Any) -> None:
  checks.at_least_one(config, '--config', 'steps', 'batch_size',
                      'micro_batches', 'log_every', 'eval_batch_size')
  checks.not_negative(config, '--config', 'logits_chunk')
  registry.check('preference_loss', config.dpo.algorithm,
                 '--config.dpo.algorithm')
  labelled = bool(preference.get(config.dpo.algorithm).labels)
  if config.data.name not in preference.PAIRED_DATA + (
      ('unpaired',) if labelled else ()):
    also = ", or 'unpaired' (labelled examples)" if labelled else ''
    raise UsageError(f'--config.data.name={config.data.name!r} has no '
                     "preference pairs; use 'preferences' (or 'arithmetic' "
                     f'for a built-in set){also}.')
  checkpoints.check_model_block(config.model)
  pipeline.check_data_block(config.data)
  optim.check(config.optimizer)
  setup.check_lora_block(config.lora)
  if min(config.dpo.kto_lambda_desirable,
         config.dpo.kto_lambda_undesirable) <= 0:
    raise UsageError('--config.dpo.kto_lambda_desirable and '
                     '--config.dpo.kto_lambda_undesirable must be positive.')
  if config.dpo.beta <= 0:
    raise UsageError(f'--config.dpo.beta={config.dpo.beta} must be positive.')
  if config.steps < 1 or config.batch_size % config.micro_batches:
    raise UsageError('--config.steps must be at least 1 and '
                     '--config.batch_size divide into micro_batches.')
  meshes_lib.check_batch(config.batch_size // config.micro_batches,
                         config.meshes, 'actor', config.sharding.batch,
                         '--config.batch_size / --config.micro_batches')


def plan(config: Any, meshes: meshes_lib.RoleMeshes, *,
         abstract: bool) -> program.Program:
  """The policy and its preference-loss train step (gradient accumulation
  over micro batches), from shapes when `abstract`."""
  mesh = meshes['actor']
  return program.build(
      config, mesh, functools.partial(
          preference.model_loss,
          algorithm=preference.get(config.dpo.algorithm),
          settings=preference.Settings.from_block(config.dpo),
          shard=Sharder(mesh, config.sharding), chunk=config.logits_chunk),
      micro_batches=config.micro_batches, total_updates=config.steps,
      abstract=abstract)


def make_logps(config: Any, graphdef: Any, mesh: Any,
               names: tuple[str, str] = SIDES):
  """Jitted (a whole model's state, batch) -> the summed log-probabilities
  of both sequences `names` (chosen and rejected, or KTO's)."""
  shard = Sharder(mesh, config.sharding)
  return jax.jit(lambda state, batch: tuple(
      preference.sequence_logps(nnx.merge(graphdef, state), batch, side,
                                shard, config.logits_chunk)[0]
      for side in names))


def compile_plan(config: Any, meshes: meshes_lib.RoleMeshes):
  """The train step, the reference's log-probabilities and the held-out
  evaluation's from shapes, for compile-only checks (pairs of full
  `max_length` rows)."""
  rules, algorithm = config.sharding, preference.get(config.dpo.algorithm)
  policy = plan(config, meshes, abstract=True)
  rows = config.batch_size * (algorithm.examples_per_pair
                              if config.data.name in preference.PAIRED_DATA
                              else 1)
  names = algorithm.sides

  def batch(count: int, names: tuple[str, ...] = names) -> dict[str, Any]:
    return {f'{side}_{key}': ((count, config.data.max_length), np.int32)
            for side in names
            for key in ('tokens', 'positions', 'segment_ids', 'loss_mask')}

  pairs = {**batch(rows), **{label: ((rows,), np.float32)
                             for label in algorithm.labels}}
  references = {f'ref_{side}': ((rows,), np.float32) for side in names
                if algorithm.reference}
  full_state = nnx.state(policy.model())
  out = plans.Plan(
      {'actor': program.resident(policy)},
      [program.train_phase(policy, plans.batch_on(
          policy.mesh, rules, {**pairs, **references})),
       plans.logps_phase(
           'evaluation', meshes, policy.mesh, full_state, rules,
           lambda mesh, state: make_logps(
               config, policy.full_graphdef, mesh).lower(
                   state, plans.batch_on(mesh, rules, batch(
                       config.eval_batch_size, SIDES))))])
  if references:
    def lower(mesh, state):  # the train batch's sides, held-out pairs
      return [make_logps(config, policy.full_graphdef, mesh, sides_).lower(
          state, plans.batch_on(mesh, rules, shapes))
              for sides_, shapes in ((names, pairs), (SIDES, batch(
                  config.eval_batch_size, SIDES)))]
    plans.reference_phase(config, meshes, full_state, lower, out)
  return out


def _reference(config: Any, policy: Any, meshes: meshes_lib.RoleMeshes,
               runtime: backend.Runtime) -> tuple[Any, Any]:
  """The reference model's log-probabilities of a host batch: of a train
  batch's sides, and of an evaluation batch of pairs (the same for all but
  KTO); (None, None) for an algorithm without one (ORPO)."""
  algorithm = preference.get(config.dpo.algorithm)
  if not algorithm.reference:
    return None, None
  scorer = scoring.reference(config, policy, meshes, runtime)
  train = make_logps(config, scorer.graphdef, scorer.mesh, algorithm.sides)
  pairs = (train if algorithm.sides == SIDES else
           make_logps(config, scorer.graphdef, scorer.mesh))
  place = lambda batch: pipeline.place(batch, scorer.mesh, config.sharding)
  return (lambda batch: train(scorer.state, place(batch)),
          lambda batch: pairs(scorer.state, place(batch)))


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  mesh, rules = meshes['actor'], config.sharding
  name = config.dpo.algorithm
  algorithm = preference.get(name)
  policy = plan(config, meshes, abstract=False)
  tokenizer = blocks.tokenizer(config.model)

  reference, reference_logps = _reference(config, policy, meshes, runtime)
  spec = pipeline.DataSpec.from_block(config.data)
  sources, _ = pipeline.prepare(spec, runtime)
  heldout = preference.heldout_pairs(config, spec.name, sources['test'],
                                     tokenizer, runtime)
  data = preference.pair_pipeline(
      config, sources['train'], spec.name, tokenizer, runtime,
      algorithm.transform, algorithm.batch, batch_size=config.batch_size,
      epochs=None, what=f'the train split of {spec.name}')
  session = loop.Session(name, config, runtime, workdir, policy.state,
                         data)
  policy_logps = make_logps(config, policy.full_graphdef, mesh)

  @functools.cache  # the last step may be an eval_every step too
  def evaluate(done: int) -> dict[str, float]:
    return session.evaluated(done, lambda: preference.pairwise_accuracy(
        lambda batch: policy_logps(nnx.state(policy.model(
            session.state.params)), pipeline.place(batch, mesh, rules)),
        reference_logps, heldout))

  def step(index: int) -> tuple[Any, int]:
    host = session.batch()
    batch = pipeline.place(host, mesh, rules)
    if reference is not None:
      for side, logps in zip(algorithm.sides, reference(host)):
        batch[f'ref_{side}'] = logps
    session.state, step_metrics = policy.train_step(session.state, batch)
    done = index + 1
    if config.eval_every and done % config.eval_every == 0:
      evaluate(done)
    return step_metrics, int(sum((host[f'{side}_segment_ids'] > 0).sum()
                                 for side in algorithm.sides))

  session.save(loop.run_steps(session, preemption, step,
                              ('loss', algorithm.progress)))
  result = evaluate(config.steps)
  session.close()
  if config.export:
    setup.export(config, policy.model(session.state.params))
  if runtime.is_coordinator:
    last = [m for m in metrics.read(workdir) if 'loss' in m][-1]
    print(f'{name}: loss {last["loss"]:.4f}, preferred '
          f'{last["preferred"]:.1%} of {algorithm.unit}; '
          f'held-out pairwise accuracy {result["eval/pairwise_accuracy"]:.1%}'
          f' of {int(result["eval/pairs"])} pairs')
