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

from tunix_pw import compile_only, console
from tunix_pw.data import formats, pipeline
from tunix_pw.errors import UsageError
from tunix_pw.jobs.data import check_data_block
from tunix_pw.models import checkpoints
from tunix_pw.models.layers import Sharder
from tunix_pw.runtime import backend, meshes as meshes_lib
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.train import loop, losses, metrics, optim, setup
from tunix_pw.train import step as step_lib
from tunix_pw.train.checkpoint import Checkpointer

SIDES = ('chosen', 'rejected')


def validate(config: Any) -> None:
  checkpoints.check_model_block(config.model)
  check_data_block(config.data)
  optim.check(config.optimizer)
  setup.check_lora_block(config.lora)
  if config.dpo.algorithm not in losses.PREFERENCE_LOSSES:
    raise UsageError(f'--config.dpo.algorithm={config.dpo.algorithm!r} is '
                     f'unknown; use one of '
                     f'{", ".join(losses.PREFERENCE_LOSSES)}.')
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
  chosen, chosen_n = sequence_logps(model, batch, 'chosen', shard)
  rejected, rejected_n = sequence_logps(model, batch, 'rejected', shard)
  if algorithm == 'orpo':
    per_pair = losses.orpo(chosen, chosen_n, rejected, rejected_n, lam)
    margin = chosen / chosen_n - rejected / rejected_n
  else:
    per_pair = getattr(losses, algorithm)(chosen, rejected,
                                          batch['ref_chosen'],
                                          batch['ref_rejected'], beta)
    margin = beta * ((chosen - rejected) -
                     (batch['ref_chosen'] - batch['ref_rejected']))
  return per_pair.sum(), dict(weight=jnp.float32(per_pair.shape[0]),
                              margin=margin.sum(),
                              preferred=(margin > 0).sum().astype(jnp.float32))


def make_train_step(config: Any, mesh: Any, graphdef: Any, params: Any,
                    frozen: Any, optimizer: Any, schedule: Any):
  """The jitted preference-loss train step (gradient accumulation over
  micro batches)."""
  return step_lib.make_step(
      graphdef, frozen, functools.partial(
          preference_loss, algorithm=config.dpo.algorithm,
          beta=config.dpo.beta, lam=config.dpo.orpo_lambda,
          shard=Sharder(mesh, config.sharding)),
      optimizer, schedule, config.micro_batches,
      jax.tree.map(lambda x: x.sharding, params))


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
  mesh, rules = meshes['actor'], config.sharding
  model = compile_only.abstract_policy(config, mesh)
  graphdef, params, frozen = setup.split(model, config.lora.rank > 0)
  optimizer, schedule = optim.make(config.optimizer, config.steps)
  state = step_lib.TrainState.abstract(params, optimizer)
  shape = (config.batch_size, config.data.max_length)
  pairs = {f'{side}_{key}': (shape, np.int32) for side in SIDES
           for key in ('tokens', 'positions', 'segment_ids', 'loss_mask')}
  references = {} if config.dpo.algorithm == 'orpo' else {
      f'ref_{side}': ((config.batch_size,), np.float32) for side in SIDES}
  phases = [compile_only.train_phase(
      make_train_step(config, mesh, graphdef, params, frozen, optimizer,
                      schedule), state, frozen,
      compile_only.batch_on(mesh, rules, {**pairs, **references}))]
  resident = {'actor': compile_only.actor_resident(state, frozen)}
  if references:
    full_graphdef, full_state = nnx.split(model)
    phases.append(compile_only.reference_phase(
        config, meshes, full_state,
        lambda ref_mesh, ref_state: make_reference_logps(
            config, full_graphdef, ref_mesh).lower(
                ref_state, compile_only.batch_on(ref_mesh, rules, pairs)),
        resident))
  return compile_only.Plan(resident, phases)


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  mesh, rules = meshes['actor'], config.sharding
  algorithm = config.dpo.algorithm
  model, _ = setup.policy(config, mesh)
  tokenizer = setup.tokenizer(config.model)
  graphdef, params, frozen = setup.split(model, config.lora.rank > 0)

  reference = None
  if algorithm != 'orpo':
    ref_state, ref_mesh = setup.reference(config, model, graphdef, params,
                                          frozen, meshes, runtime)
    reference = make_reference_logps(config, nnx.graphdef(model), ref_mesh)

  optimizer, schedule = optim.make(config.optimizer, config.steps)
  state = step_lib.TrainState.create(params, optimizer, config.seed)
  train_step = make_train_step(config, mesh, graphdef, params, frozen,
                               optimizer, schedule)

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
      batch_fn=lambda rows: formats.pad_pairs(rows, length, tokenizer.pad_id))

  checkpointer = Checkpointer(workdir, config.checkpoint.keep,
                              config.checkpoint.async_save)
  state, start = loop.resume(checkpointer, state, data, algorithm,
                             runtime.is_coordinator)
  writer = metrics.Writer(workdir, runtime.is_coordinator)

  def save(step: int) -> None:
    checkpointer.save(step, state, data.state())

  with console.Progress(config.steps - start, algorithm,
                        enabled=runtime.is_coordinator) as bar:
    tracker = loop.Tracker(writer, bar, config.log_every, config.steps,
                           config.runtime.max_inflight)
    for step in range(start, config.steps):
      host = next(data)
      batch = pipeline.place(host, mesh, rules)
      if reference is not None:
        batch['ref_chosen'], batch['ref_rejected'] = reference(
            ref_state, pipeline.place(host, ref_mesh, rules))
      state, step_metrics = train_step(state, batch)
      done = step + 1
      tracker.add(done, step_metrics,
                  int((host['chosen_segment_ids'] > 0).sum() +
                      (host['rejected_segment_ids'] > 0).sum()),
                  shown=('loss', 'margin'))
      loop.end_of_step(done, config.checkpoint.every, save, checkpointer,
                       preemption)

  tracker.throttler.wait_for_all()
  save(config.steps)
  checkpointer.close()
  writer.close()
  if config.export:
    setup.export(config, graphdef, state.params, frozen)
  if runtime.is_coordinator:
    last = metrics.read(workdir)[-1]
    print(f'{algorithm}: loss {last["loss"]:.4f}, preferred '
          f'{last["preferred"]:.1%} of pairs, margin {last["margin"]:.4f}')
