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

from tunix_pw import console
from tunix_pw.data import formats, pipeline
from tunix_pw.errors import UsageError
from tunix_pw.jobs.data import check_data_block
from tunix_pw.models import checkpoints
from tunix_pw.rl import batch as batch_lib, registry, rewards as rewards_lib
from tunix_pw.rl import functions  # pylint: disable=unused-import (registers)
from tunix_pw.runtime import backend, meshes as meshes_lib, reshard, sharding
from tunix_pw.runtime.fetch import fetch
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.sampling.rollout import SamplingConfig
from tunix_pw.sampling.sampler import make_sampler
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


def token_logps(model, tokens, positions, segments):
  """log p(token t+1 | ...) at every position [N, T-1], and the entropy."""
  logits, _ = model(tokens, positions, segments)
  logp_all = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
  logp = jnp.take_along_axis(logp_all, tokens[:, 1:, None], -1)[..., 0]
  entropy = -(jnp.exp(logp_all) * logp_all).sum(-1)
  return logp, entropy


def rl_loss(model, batch, rng, *, rl: Any):
  """The registered policy loss (+ KL), aggregated; metric sums weighted so
  the step's division yields batch averages."""
  del rng
  logp, entropy = token_logps(model, batch['tokens'], batch['positions'],
                              batch['segment_ids'])
  mask = batch['loss_mask'][:, 1:].astype(jnp.float32)
  old = batch.get('old_logps', jax.lax.stop_gradient(logp))
  per_token, clipped = registry.get('policy_loss', rl.policy_loss)(
      logp, old, batch['advantages'], mask, rl.eps_low, rl.eps_high)
  kl = jnp.zeros_like(logp)
  if 'ref_logps' in batch:
    kl = registry.get('kl', rl.kl)(logp, batch['ref_logps'])
    per_token = per_token + rl.kl_beta * kl
  aggregate = registry.get('aggregation', rl.aggregation)
  loss, weight = aggregate(per_token, mask, batch['weights'],
                           rl.max_new_tokens)
  live = mask * batch['weights'][:, None]
  share = weight / jnp.maximum(live.sum(), 1.0)  # token average x weight
  return loss, dict(weight=weight,
                    clip_fraction=(clipped * live).sum() * share,
                    kl=(kl * live).sum() * share,
                    entropy=(entropy * live).sum() * share)


def rollout(sampler, data, tokenizer, rl, weights, step: int, seed: int):
  """Groups for one step: generate, score, and with dynamic sampling drop
  groups of equal rewards and refill from new prompts, up to
  `refill_rounds`; short of groups at the cap, the last group repeats with
  weight 0. Returns (groups, group weights, counts)."""
  kept, counts = [], dict(dropped=0, padded=0, rounds=0, reward_errors=0,
                          generated=0)
  while True:
    prompts = next(data)
    out = sampler.generate(
        [p['prompt'] for p in prompts for _ in range(rl.num_generations)],
        SamplingConfig(max_new_tokens=rl.max_new_tokens,
                       temperature=rl.temperature, top_k=rl.top_k,
                       top_p=rl.top_p,
                       seed=seed * 1_000_003 + step * 101 + counts['rounds']))
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    counts['generated'] += int(lengths.sum())
    for i, prompt in enumerate(prompts):
      rows = range(i * rl.num_generations, (i + 1) * rl.num_generations)
      completions = [tokens[r, :lengths[r]].tolist() for r in rows]
      truncated = [not c or c[-1] not in tokenizer.stop_ids
                   for c in completions]
      samples = [rewards_lib.Sample(
          prompt=tokenizer.decode(prompt['prompt']),
          completion=tokenizer.decode(
              [t for t in c if t not in tokenizer.stop_ids]),
          answer=prompt['answer'], length=len(c), budget=rl.max_new_tokens,
          truncated=t) for c, t in zip(completions, truncated)]
      total, per_fn, errors = rewards_lib.score(samples, weights,
                                                rl.strict_rewards)
      counts['reward_errors'] += errors
      group = batch_lib.Group(prompt['prompt'], prompt['answer'], completions,
                              truncated, total, per_fn)
      if rl.dynamic_sampling and not group.informative:
        counts['dropped'] += 1
        continue
      kept.append(group)
    if (not rl.dynamic_sampling or len(kept) >= rl.prompts_per_step or
        counts['rounds'] >= rl.refill_rounds):
      break
    counts['rounds'] += 1
  kept = kept[:rl.prompts_per_step]
  group_weights = [1.0] * len(kept)
  while len(kept) < rl.prompts_per_step:  # static shapes: zero-weight filler
    kept.append(kept[-1] if kept else group)
    group_weights.append(0.0)
    counts['padded'] += 1
  return kept, group_weights, counts


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

  # The rollout engine: a copy of the policy on the rollout mesh.
  rollout_state, _ = reshard.transfer(
      nnx.state(model), checkpoints.param_shardings(
          nnx.state(model), rollout_mesh, rules), runtime)
  sampler = make_sampler(nnx.merge(full_graphdef, rollout_state), tokenizer,
                         mesh=rollout_mesh, rules=rules, runtime=runtime,
                         max_cache=rl.max_prompt_length + rl.max_new_tokens)

  logps = jax.jit(lambda state, b: token_logps(
      nnx.merge(full_graphdef, state), b['tokens'], b['positions'],
      b['segment_ids'])[0])
  reference = None
  if rl.kl_beta:
    if use_lora:  # the frozen base is the reference: adapters set to zero
      zeros = jax.tree.map(jnp.zeros_like, params)
      reference = (nnx.state(nnx.merge(graphdef, zeros, frozen)), actor_mesh)
    else:  # the frozen initial policy, on its own role
      ref_mesh = meshes['reference'] if 'reference' in meshes.by_role \
          else actor_mesh
      ref_state, _ = reshard.transfer(
          nnx.state(model), checkpoints.param_shardings(
              nnx.state(model), ref_mesh, rules), runtime)
      reference = (ref_state, ref_mesh)

  optimizer, schedule = optim.make(config.optimizer, config.steps *
                                   rl.num_iterations * (
                                       rl.prompts_per_step *
                                       rl.num_generations //
                                       rl.mini_batch_size))
  state = step_lib.TrainState.create(params, optimizer, config.seed)
  train_step = step_lib.make_step(
      graphdef, frozen, functools.partial(rl_loss, rl=rl), optimizer,
      schedule, rl.mini_batch_size // rl.micro_batch_size)

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

  def evaluate_now(step: int) -> dict[str, float]:
    result = evaluate.exact_match(
        sampler, tokenizer, eval_prompts, eval_answers, rl.max_new_tokens,
        config.eval_batch_size)
    return writer.write(step, {f'eval/{k}': v for k, v in result.items()})

  def on_mesh(arrays, mesh):
    return pipeline.place(arrays, mesh, rules)

  def logps_in_chunks(params_state, arrays, mesh):
    size = rl.logps_micro_batch_size
    return jnp.concatenate([logps(params_state, on_mesh(
        {k: v[i:i + size] for k, v in arrays.items()}, mesh))
                            for i in range(0, len(arrays['tokens']), size)])

  if config.eval_examples and start == 0:
    evaluate_now(0)
  with console.Progress(config.steps - start, 'grpo',
                        enabled=runtime.is_coordinator) as bar:
    for step in range(start, config.steps):
      done = step + 1
      timer = {}
      clock = time.perf_counter()
      groups, group_weights, counts = rollout(
          sampler, data, tokenizer, rl, reward_weights, step, config.seed)
      timer['rollout'] = time.perf_counter() - clock
      preemption.check(lambda: save(step))  # pylint: disable=cell-var-from-loop

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
      if rl.num_iterations > 1 or rl.mini_batch_size < len(arrays['tokens']):
        current = nnx.state(nnx.merge(graphdef, state.params,
                                      *([] if frozen is None else [frozen])))
        extra['old_logps'] = logps_in_chunks(current, sequences, actor_mesh)
      # On the actor mesh, sharded like the batch they go with.
      extra, _ = reshard.transfer(extra, {
          k: sharding.named(actor_mesh, v.shape, ('batch', None), rules)
          for k, v in extra.items()}, runtime)
      timer['logps'] = time.perf_counter() - clock
      preemption.check(lambda: save(step))  # pylint: disable=cell-var-from-loop

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
  if runtime.is_coordinator and result:
    print(f'grpo: held-out greedy exact match {result["eval/accuracy"]:.1%} '
          f'({int(result["eval/correct"])}/{int(result["eval/total"])}, '
          f'95% CI {result["eval/ci_low"]:.1%}-{result["eval/ci_high"]:.1%})')
