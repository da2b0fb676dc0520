"""GRPO and its variants (DAPO, Dr. GRPO, GSPO-token), one explicit loop.

prompts -> rollout on the rollout mesh (G generations each; DAPO refills
groups whose rewards are all equal) -> rewards -> advantages -> reference
and old log-probabilities -> mini-batch updates on the actor mesh
(gradient accumulation, num_iterations reuses of the rollout) -> weight
sync actor -> rollout (the runtime's reshard) -> metrics -> evaluation ->
checkpoint, with preemption checked at every phase boundary.
"""

from __future__ import annotations

import functools
import time
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
from tunix_pw.rl import batch as batch_lib, loss as loss_lib, registry
from tunix_pw.rl import rewards as rewards_lib
from tunix_pw.runtime import backend, meshes as meshes_lib, reshard, sharding
from tunix_pw.runtime.fetch import fetch
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.sampling.rollout import SamplingConfig
from tunix_pw.sampling.sampler import Sampler, make_sampler
from tunix_pw.train import evaluate, loop, metrics, optim, setup
from tunix_pw.train import step as step_lib
from tunix_pw.train.checkpoint import Checkpointer


def validate(config: Any) -> None:
  checkpoints.check_model_block(config.model)
  check_data_block(config.data)
  optim.check(config.optimizer)
  setup.check_lora_block(config.lora)
  rl = config.rl
  for kind, name in (('advantage', rl.advantage),
                     ('policy_loss', rl.policy_loss),
                     ('aggregation', rl.aggregation), ('kl', rl.kl)):
    registry.check(kind, name, f'--config.rl.{kind}')
  rewards_lib.parse_weights(rl.rewards)
  samples = rl.prompts_per_step * rl.num_generations
  if rl.num_generations < 2:
    raise UsageError('--config.rl.num_generations must be at least 2 (a '
                     'group needs others to compare with).')
  if samples % rl.mini_batch_size or rl.mini_batch_size % rl.micro_batch_size:
    raise UsageError(
        f'--config.rl.mini_batch_size={rl.mini_batch_size} must divide the '
        f'{samples} samples of a step (prompts_per_step x num_generations) '
        f'and be divided by --config.rl.micro_batch_size='
        f'{rl.micro_batch_size}.')
  if samples % rl.logps_micro_batch_size:
    raise UsageError(f'--config.rl.logps_micro_batch_size='
                     f'{rl.logps_micro_batch_size} must divide the {samples} '
                     'samples of a step.')
  for role in ('actor', 'rollout'):
    if role not in config.meshes:
      raise UsageError(f'--config.meshes needs an {role} role.')
  meshes_lib.check_batch(rl.micro_batch_size, config.meshes, 'actor',
                         config.sharding.batch, '--config.rl.micro_batch_size')
  meshes_lib.check_batch(samples, config.meshes, 'rollout',
                         config.sharding.batch,
                         'prompts_per_step x num_generations')


def make_optimizer(config: Any):
  """(optimizer, schedule) over every update of the run."""
  rl = config.rl
  samples = rl.prompts_per_step * rl.num_generations
  return optim.make(config.optimizer, config.steps * rl.num_iterations *
                    (samples // rl.mini_batch_size))


def make_train_step(config: Any, mesh, graphdef, params, frozen, optimizer,
                    schedule):
  rl = config.rl
  return step_lib.make_step(
      graphdef, frozen, functools.partial(
          loss_lib.rl_loss, rl=rl, shard=Sharder(mesh, config.sharding)),
      optimizer, schedule, rl.mini_batch_size // rl.micro_batch_size,
      jax.tree.map(lambda x: x.sharding, params))


def make_logps(config: Any, mesh, graphdef):
  """jitted (params state, sequences) -> per-token log-probabilities, on
  `mesh`."""
  shard = Sharder(mesh, config.sharding)
  return jax.jit(lambda state, b: loss_lib.token_logps(
      nnx.merge(graphdef, state), b['tokens'], b['positions'],
      b['segment_ids'], shard)[0])


def logps_keys(rl: Any) -> tuple[str, ...]:
  """The log-probabilities an update needs: the reference's (for the KL
  term) and the rollout policy's (when a rollout feeds several updates)."""
  samples = rl.prompts_per_step * rl.num_generations
  return (('ref_logps',) if rl.kl_beta else ()) + (
      ('old_logps',) if rl.num_iterations > 1 or rl.mini_batch_size < samples
      else ())


def sampling_config(rl: Any, seed: int = 0) -> SamplingConfig:
  return SamplingConfig(max_new_tokens=rl.max_new_tokens,
                        temperature=rl.temperature, top_k=rl.top_k,
                        top_p=rl.top_p, seed=seed)


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  rl, rules = config.rl, config.sharding
  actor_mesh, rollout_mesh = meshes['actor'], meshes['rollout']
  use_lora = config.lora.rank > 0
  reward_weights = rewards_lib.parse_weights(rl.rewards)
  model, _ = setup.policy(config, actor_mesh)
  tokenizer = setup.tokenizer(config.model)
  graphdef, params, frozen = setup.split(model, use_lora)
  full_graphdef = nnx.graphdef(model)

  # The rollout engine: a copy of the policy on the rollout mesh, owned by
  # the engine alone (weight syncs then free the previous copy).
  sampler = make_sampler(
      nnx.merge(full_graphdef, reshard.transfer(
          nnx.state(model), checkpoints.param_shardings(
              nnx.state(model), rollout_mesh, rules), runtime)[0]),
      tokenizer, mesh=rollout_mesh, rules=rules, runtime=runtime,
      max_cache=rl.max_prompt_length + rl.max_new_tokens)

  logps_on = functools.cache(
      lambda mesh: make_logps(config, mesh, full_graphdef))
  needed = logps_keys(rl)
  reference = None
  if 'ref_logps' in needed:
    reference = setup.reference(config, model, graphdef, params, frozen,
                                meshes, runtime)

  optimizer, schedule = make_optimizer(config)
  state = step_lib.TrainState.create(params, optimizer, config.seed)
  train_step = make_train_step(config, actor_mesh, graphdef, params,
                               frozen, optimizer, schedule)

  spec = pipeline.DataSpec.from_block(config.data)
  sources, _ = pipeline.prepare(spec, runtime)
  data = pipeline.Pipeline(
      sources['train'], formats.prompt_transform(
          spec.name, tokenizer, rl.max_prompt_length, config.data.chat),
      batch_size=rl.prompts_per_step, seed=config.seed, num_epochs=None)
  eval_prompts, eval_answers = setup.heldout(
      spec.name, sources['test'], tokenizer, config.eval_examples,
      config.data.chat)

  checkpointer = Checkpointer(workdir, config.checkpoint.keep,
                              config.checkpoint.async_save)
  state, start = loop.resume(checkpointer, state, data, 'grpo',
                             runtime.is_coordinator)
  if start:
    sampler.update_weights(state.params)
  writer = metrics.Writer(workdir, runtime.is_coordinator)
  length = rl.max_prompt_length + rl.max_new_tokens

  def save(step: int) -> None:
    checkpointer.save(step, state, data.state())

  def stop_mid_step(step: int, data_state: dict[str, Any]) -> None:
    """A stop inside a step keeps the state before it with the data where
    the step began: the resumed run redoes the step as it would have run."""
    checkpointer.save(step, state, data_state)
    checkpointer.wait()

  @functools.cache  # the last step may be an eval_every step too
  def evaluate_now(step: int) -> dict[str, float]:
    result = evaluate.exact_match(
        sampler, tokenizer, eval_prompts, eval_answers, rl.max_new_tokens,
        config.eval_batch_size)
    return writer.write(step, {f'eval/{k}': v for k, v in result.items()})

  def on_mesh(arrays, mesh):
    # Every process holds the whole rollout (they generated it in step).
    return {k: jax.device_put(v, sharding.batch(mesh, v.shape, rules))
            for k, v in arrays.items()}

  def logps_in_chunks(params_state, arrays, mesh):
    size = rl.logps_micro_batch_size
    return jnp.concatenate([logps_on(mesh)(params_state, on_mesh(
        {k: v[i:i + size] for k, v in arrays.items()}, mesh))
                            for i in range(0, len(arrays['tokens']), size)])

  if config.eval_examples and start == 0:
    evaluate_now(0)
  with console.Progress(config.steps - start, 'grpo',
                        enabled=runtime.is_coordinator) as bar:
    for step in range(start, config.steps):
      done = step + 1
      timer = {}
      stop = functools.partial(stop_mid_step, step, data.state())
      clock = time.perf_counter()
      groups, group_weights, counts = batch_lib.rollout(
          sampler, data, tokenizer, rl, reward_weights,
          lambda rounds: sampling_config(  # pylint: disable=cell-var-from-loop
              rl, config.seed * 1_000_003 + step * 101 + rounds))
      timer['rollout'] = time.perf_counter() - clock
      preemption.check(stop)

      clock = time.perf_counter()
      arrays = batch_lib.to_arrays(groups, group_weights, length,
                                   tokenizer.pad_id,
                                   registry.get('advantage', rl.advantage))
      sequences = {k: arrays[k] for k in ('tokens', 'positions',
                                          'segment_ids')}
      extra = {}
      if reference is not None:
        extra['ref_logps'] = logps_in_chunks(reference[0], sequences,
                                             reference[1])
      if 'old_logps' in needed:
        current = nnx.state(nnx.merge(graphdef, state.params,
                                      *([] if frozen is None else [frozen])))
        extra['old_logps'] = logps_in_chunks(current, sequences, actor_mesh)
      # On the actor mesh, sharded like the batch they go with.
      extra, _ = reshard.transfer(extra, {
          k: sharding.batch(actor_mesh, v.shape, rules)
          for k, v in extra.items()}, runtime)
      timer['logps'] = time.perf_counter() - clock
      preemption.check(stop)

      clock = time.perf_counter()
      on_actor = dict(on_mesh(arrays, actor_mesh), **extra)
      n = len(arrays['tokens'])
      for _ in range(rl.num_iterations):
        for start_row in range(0, n, rl.mini_batch_size):
          mini = {k: v[start_row:start_row + rl.mini_batch_size]
                  for k, v in on_actor.items()}
          state, step_metrics = train_step(state, mini)
      step_metrics = fetch(step_metrics)
      timer['train'] = time.perf_counter() - clock

      clock = time.perf_counter()
      sampler.update_weights(state.params)
      timer['weight_sync'] = time.perf_counter() - clock
      if step == start and runtime.is_coordinator and sampler.last_sync:
        print(f'grpo: weight sync by {sampler.last_sync.path}, '
              f'{sampler.last_sync.bytes / 2**20:.1f} MiB', flush=True)

      values = dict(step_metrics, **{f'time/{k}': v for k, v in timer.items()},
                    **{k: v for k, v in counts.items()})
      real = [g for g, w in zip(groups, group_weights) if w]
      rewards_all = np.concatenate([g.rewards for g in real]) if real else \
          np.zeros(1)
      values.update(
          reward_mean=float(rewards_all.mean()),
          reward_std=float(rewards_all.std()),
          kept_group_fraction=len(real) / max(
              len(real) + counts['dropped'], 1),
          response_length=float(np.mean([len(c) for g in real
                                         for c in g.completions] or [0])),
          rollout_tokens_per_s=counts['generated'] / timer['rollout'],
          sync_bytes=sampler.last_sync.bytes if sampler.last_sync else 0,
          compilations=metrics.compilations(),
          **{f'reward/{name}': float(np.concatenate(
              [g.per_reward[name] for g in real]).mean()) if real else 0.0
             for name, _ in reward_weights},
          **({'accuracy': float(np.concatenate(
              [g.per_reward['exact_answer'] for g in real]).mean())}
             if real and 'exact_answer' in dict(reward_weights) else {}))
      if done % config.log_every == 0 or done == config.steps:
        writer.write(done, values)
      bar.update(loss=values['loss'], reward=values['reward_mean'])
      if config.eval_every and done % config.eval_every == 0:
        evaluate_now(done)
      loop.end_of_step(done, config.checkpoint.every, save, checkpointer,
                       preemption)

  save(config.steps)
  result = evaluate_now(config.steps) if config.eval_examples else {}
  checkpointer.close()
  writer.close()
  if config.export:
    setup.export(config, graphdef, state.params, frozen)
  if runtime.is_coordinator and result:
    print(f'grpo: held-out greedy exact match {result["eval/accuracy"]:.1%} '
          f'({int(result["eval/correct"])}/{int(result["eval/total"])}, '
          f'95% CI {result["eval/ci_low"]:.1%}-{result["eval/ci_high"]:.1%})')


def compile_plan(config: Any, meshes: meshes_lib.RoleMeshes):
  """This job's programs, from shapes, for compile-only checks: the train
  step, the logps passes, the rollout program and the weight sync's
  relayouts, with the state each role keeps resident."""
  rl, rules = config.rl, config.sharding
  actor_mesh, rollout_mesh = meshes['actor'], meshes['rollout']
  model = compile_only.abstract_policy(config, actor_mesh)
  graphdef, params, frozen = setup.split(model, config.lora.rank > 0)
  full_graphdef, full_state = nnx.split(model)
  optimizer, schedule = make_optimizer(config)
  train_step = make_train_step(config, actor_mesh, graphdef, params,
                               frozen, optimizer, schedule)
  state = step_lib.TrainState.abstract(params, optimizer)
  rollout_state = compile_only.on_mesh(full_state, rollout_mesh, rules)
  sampler = Sampler(nnx.merge(full_graphdef, rollout_state), pad_id=0,
                    eos_ids=(1,), mesh=rollout_mesh, rules=rules)
  samples = rl.prompts_per_step * rl.num_generations
  length = rl.max_prompt_length + rl.max_new_tokens
  group = batch_lib.Group([0], '', [[0]] * rl.num_generations,
                          [False] * rl.num_generations,
                          np.zeros(rl.num_generations), {})
  arrays = batch_lib.to_arrays([group], [1.0], length, 0,
                               registry.get('advantage', rl.advantage))
  needed = logps_keys(rl)

  def rows(count, mesh, keys, logps_names=()):
    shapes = {k: ((count,) + arrays[k].shape[1:], arrays[k].dtype)
              for k in keys}
    shapes.update({k: ((count, length - 1), np.float32) for k in logps_names})
    return compile_only.batch_on(mesh, rules, shapes)

  sequences = ('tokens', 'positions', 'segment_ids')

  def lower_logps(mesh, params_state):
    return make_logps(config, mesh, full_graphdef).lower(
        params_state, rows(rl.logps_micro_batch_size, mesh, sequences))

  synced = compile_only.on_mesh(params, rollout_mesh, rules)

  def sync(side):
    return lambda: reshard.compile_relayouts(
        jax.tree.leaves(params), [x.sharding for x in jax.tree.leaves(synced)],
        config.runtime.reshard_group_mib << 20)[side]

  sampling = sampling_config(rl)
  phases = [
      compile_only.train_phase(
          train_step, state, frozen,
          rows(rl.mini_batch_size, actor_mesh, arrays, needed)),
      compile_only.Phase(
          'rollout', 'rollout',
          lambda: [sampler.lower(samples, rl.max_prompt_length,
                                 sampling).compile()],
          resident_args=compile_only.per_device(rollout_state),
          note=lambda: 'KV cache ' + compile_only.size(sampler.cache_bytes(
              samples, rl.max_prompt_length, sampling))),
      # The engine serves the old weights until the new ones have landed.
      compile_only.Phase('weight sync in', 'rollout', sync('target'),
                         held=compile_only.per_device(synced),
                         inflight=config.runtime.max_inflight),
      compile_only.Phase('weight sync out', 'actor', sync('source'),
                         inflight=config.runtime.max_inflight),
  ]
  if 'old_logps' in needed:
    phases.append(compile_only.logps_phase('old logps', meshes, actor_mesh,
                                           full_state, rules, lower_logps))
  resident = {'actor': compile_only.actor_resident(state, frozen),
              'rollout': {'rollout copy': compile_only.per_device(
                  rollout_state)}}
  if 'ref_logps' in needed:
    phases.append(compile_only.reference_phase(config, meshes, full_state,
                                               lower_logps, resident))
  return compile_only.Plan(resident, phases)
