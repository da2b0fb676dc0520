"""DPO, IPO and ORPO: preference tuning, one explicit loop.

data (prompt, chosen, rejected) -> reference log-probabilities of both
completions (frozen initial policy on the reference mesh; none for ORPO)
-> train step (gradient accumulation) -> metrics -> checkpoint ->
preemption check.
"""

from __future__ import annotations

import functools
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from tunix_pw import checks, compile_only
from tunix_pw.data import formats, pipeline
from tunix_pw.errors import UsageError
from tunix_pw.models import checkpoints
from tunix_pw.rl import registry
from tunix_pw.runtime import backend, meshes as meshes_lib
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.runtime.sharding import Sharder
from tunix_pw.train import loop, losses, metrics, optim, program, scoring
from tunix_pw.train import setup
from tunix_pw.train import step as step_lib

SIDES = ('chosen', 'rejected')


def validate(config: Any) -> None:
  checks.at_least_one(config, '--config', 'steps', 'batch_size',
                      'micro_batches', 'log_every')
  checkpoints.check_model_block(config.model)
  pipeline.check_data_block(config.data)
  optim.check(config.optimizer)
  setup.check_lora_block(config.lora)
  registry.check('preference_loss', config.dpo.algorithm,
                 '--config.dpo.algorithm')
  if config.data.name not in ('preferences', 'arithmetic'):
    raise UsageError(f'--config.data.name={config.data.name!r} has no '
                     "preference pairs; use 'preferences' (or 'arithmetic' "
                     'for a built-in set).')
  if config.dpo.beta <= 0:
    raise UsageError(f'--config.dpo.beta={config.dpo.beta} must be positive.')
  if config.steps < 1 or config.batch_size % config.micro_batches:
    raise UsageError('--config.steps must be at least 1 and '
                     '--config.batch_size divide into micro_batches.')
  meshes_lib.check_batch(config.batch_size // config.micro_batches,
                         config.meshes, 'actor', config.sharding.batch,
                         '--config.batch_size / --config.micro_batches')


def sequence_logps(model, batch, side: str, shard: Sharder = Sharder()):
  """Summed completion log-probability and completion length per row."""
  logits, _ = model(batch[f'{side}_tokens'], batch[f'{side}_positions'],
                    batch[f'{side}_segment_ids'], shard=shard)
  nll, weight, _ = step_lib.token_nll(
      logits, batch[f'{side}_tokens'], batch[f'{side}_loss_mask'],
      batch[f'{side}_segment_ids'])
  return -(nll * weight).sum(-1), weight.sum(-1)


def preference_loss(model, batch, rng, *, algorithm: str, beta: float,
                    lam: float, shard: Sharder = Sharder()):
  del rng
  pair = losses.Pair(*sequence_logps(model, batch, 'chosen', shard),
                     *sequence_logps(model, batch, 'rejected', shard),
                     batch.get('ref_chosen'), batch.get('ref_rejected'))
  per_pair = registry.get('preference_loss', algorithm)(pair, beta, lam)
  if algorithm == 'orpo':  # no reference: the mean log-probabilities' margin
    margin = (pair.chosen / pair.chosen_tokens -
              pair.rejected / pair.rejected_tokens)
  else:
    margin = beta * losses.margin(pair)
  return per_pair.sum(), dict(weight=jnp.float32(per_pair.shape[0]),
                              margin=margin.sum(),
                              preferred=(margin > 0).sum().astype(jnp.float32))


def plan(config: Any, meshes: meshes_lib.RoleMeshes, *,
         abstract: bool) -> program.Program:
  """The policy and its preference-loss train step (gradient accumulation
  over micro batches), from shapes when `abstract`."""
  mesh = meshes['actor']
  return program.build(
      config, mesh, functools.partial(
          preference_loss, algorithm=config.dpo.algorithm,
          beta=config.dpo.beta, lam=config.dpo.orpo_lambda,
          shard=Sharder(mesh, config.sharding)),
      micro_batches=config.micro_batches, total_updates=config.steps,
      abstract=abstract)


def make_reference_logps(config: Any, graphdef: Any, mesh: Any):
  """Jitted (reference state, pairs) -> the summed log-probabilities of
  the chosen and the rejected completions."""
  shard = Sharder(mesh, config.sharding)
  return jax.jit(lambda state, batch: tuple(
      sequence_logps(nnx.merge(graphdef, state), batch, side, shard)[0]
      for side in SIDES))


def compile_plan(config: Any, meshes: meshes_lib.RoleMeshes):
  """The train step and the reference's log-probabilities from shapes,
  for compile-only checks (pairs of full `max_length` rows)."""
  rules = config.sharding
  policy = plan(config, meshes, abstract=True)
  shape = (config.batch_size, config.data.max_length)
  pairs = {f'{side}_{key}': (shape, np.int32) for side in SIDES
           for key in ('tokens', 'positions', 'segment_ids', 'loss_mask')}
  references = {} if config.dpo.algorithm == 'orpo' else {
      f'ref_{side}': ((config.batch_size,), np.float32) for side in SIDES}
  phases = [program.train_phase(policy, compile_only.batch_on(
      policy.mesh, rules, {**pairs, **references}))]
  resident = {'actor': program.resident(policy)}
  if references:
    phases.append(compile_only.reference_phase(
        config, meshes, nnx.state(policy.model()),
        lambda ref_mesh, ref_state: make_reference_logps(
            config, policy.full_graphdef, ref_mesh).lower(
                ref_state, compile_only.batch_on(ref_mesh, rules, pairs)),
        resident))
  return compile_only.Plan(resident, phases)


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  mesh, rules = meshes['actor'], config.sharding
  algorithm = config.dpo.algorithm
  policy = plan(config, meshes, abstract=False)
  tokenizer = setup.tokenizer(config.model)

  reference = None
  if algorithm != 'orpo':
    scorer = scoring.reference(config, policy, meshes, runtime)
    reference = make_reference_logps(config, scorer.graphdef, scorer.mesh)

  spec = pipeline.DataSpec.from_block(config.data)
  sources, _ = pipeline.prepare(spec, runtime)
  length = config.data.max_length
  data = pipeline.Pipeline(
      sources['train'], formats.preference_transform(
          spec.name, tokenizer, length, config.data.overlong,
          config.data.chat),
      batch_size=config.batch_size, seed=config.seed, num_epochs=None,
      process_index=runtime.process_index,
      process_count=runtime.process_count,
      batch_fn=lambda rows: formats.pad_pairs(rows, length, tokenizer.pad_id),
      what=f'the train split of {spec.name}',
      dropping=pipeline.overlong_filter(config.data))

  session = loop.Session(algorithm, config, runtime, workdir, policy.state,
                         data)

  def step(index: int) -> tuple[Any, int]:
    del index
    host = next(data)
    batch = pipeline.place(host, mesh, rules)
    if reference is not None:
      batch['ref_chosen'], batch['ref_rejected'] = reference(
          scorer.state, pipeline.place(host, scorer.mesh, rules))
    session.state, step_metrics = policy.train_step(session.state, batch)
    return step_metrics, int((host['chosen_segment_ids'] > 0).sum() +
                             (host['rejected_segment_ids'] > 0).sum())

  session.save(loop.run_steps(session, preemption, step, ('loss', 'margin')))
  session.close()
  if config.export:
    setup.export(config, policy.model(session.state.params))
  if runtime.is_coordinator:
    last = metrics.read(workdir)[-1]
    print(f'{algorithm}: loss {last["loss"]:.4f}, preferred '
          f'{last["preferred"]:.1%} of pairs, margin {last["margin"]:.4f}')
