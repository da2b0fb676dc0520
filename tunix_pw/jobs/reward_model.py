"""A reward model: a decoder with a scalar head (`models/value.py`) trained
on preference pairs with the Bradley-Terry loss, one explicit loop.

pairs (prompt, chosen, rejected) -> each sequence's score (the head's value
at its last token) -> -log sigmoid(s_chosen - s_rejected) -> train step
(gradient accumulation) -> metrics -> held-out pairwise accuracy ->
checkpoint -> preemption check; `--config.export` writes the Hugging Face
layout of a one-label sequence classifier.
"""

from __future__ import annotations

import functools
from typing import Any

from flax import nnx
import jax.numpy as jnp

from tunix_pw import checks
from tunix_pw.data import formats, pipeline
from tunix_pw.errors import UsageError
from tunix_pw.models import blocks, checkpoints, hf, tokenizers, value
from tunix_pw.rl import critic, reward_model
from tunix_pw.runtime import backend, meshes as meshes_lib
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.runtime.sharding import Sharder
from tunix_pw.train import loop, optim, plans, preference, program, setup

SIDES = reward_model.SIDES
KEYS = ('tokens', 'positions', 'segment_ids', 'loss_mask')


def validate(config: Any) -> None:
  checks.at_least_one(config, '--config', 'steps', 'batch_size',
                      'micro_batches', 'log_every', 'eval_batch_size')
  checkpoints.check_model_block(config.model)
  pipeline.check_data_block(config.data)
  optim.check(config.optimizer)
  if config.data.name not in ('preferences', 'arithmetic'):
    raise UsageError(f'--config.data.name={config.data.name!r} has no '
                     "preference pairs; use 'preferences' (or 'arithmetic' "
                     'for a built-in set).')
  if config.batch_size % config.micro_batches:
    raise UsageError(f'--config.batch_size={config.batch_size} must divide '
                     f'into --config.micro_batches={config.micro_batches}.')
  meshes_lib.check_batch(config.batch_size // config.micro_batches,
                         config.meshes, 'actor', config.sharding.batch,
                         '--config.batch_size / --config.micro_batches')


def plan(config: Any, meshes: meshes_lib.RoleMeshes, *,
         abstract: bool) -> program.Program:
  """The value model (the model block's decoder, a fresh head) and its
  train step on the actor mesh, from shapes when `abstract`."""
  mesh, rules = meshes['actor'], config.sharding
  if abstract:
    model = critic.abstract_model(config.model, config.seed, mesh, rules)
  else:
    base, _ = setup.model_from_block(config.model, seed=config.seed,
                                     mesh=mesh, rules=rules)
    model = value.from_decoder(base, config.seed, mesh, rules)
  return program.from_model(
      model, mesh, functools.partial(reward_model.bradley_terry_loss,
                                     shard=Sharder(mesh, rules)),
      use_lora=False, optimizer=config.optimizer, seed=config.seed,
      micro_batches=config.micro_batches, total_updates=config.steps,
      abstract=abstract, unroll_on_cpu=config.model.unroll_cpu_train,
      init=setup.init_program(config.model, seed=config.seed, mesh=mesh,
                              rules=rules))


def compile_plan(config: Any, meshes: meshes_lib.RoleMeshes):
  """The train step on pairs of full `max_length` rows and the held-out
  margins on evaluation batches, from shapes."""
  model_program = plan(config, meshes, abstract=True)
  mesh, rules = model_program.mesh, config.sharding

  def pairs_of(rows: int) -> dict[str, Any]:
    return plans.batch_on(mesh, rules, {
        f'{side}_{key}': ((rows, config.data.max_length), jnp.int32)
        for side in SIDES for key in KEYS})

  margins = reward_model.margins_program(config, model_program)
  return plans.Plan({'actor': program.resident(model_program)}, [
      program.train_phase(model_program, pairs_of(config.batch_size)),
      plans.Phase('evaluation', 'actor', lambda: [margins.lower(
          model_program.params, pairs_of(config.eval_batch_size)).compile()],
                         resident_args=plans.per_device(
                             model_program.params))])


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  model_program = plan(config, meshes, abstract=False)
  mesh, rules = model_program.mesh, config.sharding
  tokenizer = blocks.tokenizer(config.model)
  spec = pipeline.DataSpec.from_block(config.data)
  sources, _ = pipeline.prepare(spec, runtime)
  pipeline.check_eval_batch(sources['test'], config.eval_batch_size,
                            f'the test split of {spec.name}')
  pairs = functools.partial(
      preference.pair_pipeline, config, transform=formats.preference_transform,
      batch_fn=formats.pad_pairs, name=spec.name, tokenizer=tokenizer,
      runtime=runtime)
  data = pairs(source=sources['train'], batch_size=config.batch_size,
               epochs=None, what=f'the train split of {spec.name}')
  heldout = lambda: pairs(source=sources['test'],
                          batch_size=config.eval_batch_size, epochs=1,
                          what=f'the test split of {spec.name}')
  session = loop.Session('reward_model', config, runtime, workdir,
                         model_program.state, data)
  margins = reward_model.margins_program(config, model_program)  # compiled once

  @functools.cache  # the last step may be an eval_every step too
  def evaluate(done: int) -> dict[str, float]:
    return session.evaluated(done, lambda: reward_model.pairwise_accuracy(
        config, margins, mesh, session.state.params, heldout))

  def step(index: int) -> tuple[Any, int]:
    host = session.batch()
    session.state, step_metrics = model_program.train_step(
        session.state, pipeline.place(host, mesh, rules))
    done = index + 1
    if config.eval_every and done % config.eval_every == 0:
      evaluate(done)
    return step_metrics, int(sum((host[f'{s}_segment_ids'] > 0).sum()
                                 for s in SIDES))

  session.save(loop.run_steps(session, preemption, step,
                              ('loss', 'accuracy')))
  result = evaluate(config.steps)
  session.close()
  if config.export:
    final = model_program.model(session.state.params)
    hf.save(config.export, final.cfg, nnx.state(final),
            classifier_pad_id=tokenizer.pad_id)
    tokenizers.save(blocks.tokenizer_source(config.model), config.export)
  if runtime.is_coordinator:
    print(f'reward_model: held-out pairwise accuracy '
                f'{result["eval/pairwise_accuracy"]:.1%} of '
                f'{int(result["eval/pairs"])} pairs')
