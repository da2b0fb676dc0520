"""An RL step as phases, each a small function over explicit inputs:

  rollout   generate G completions per prompt on the rollout mesh, then
            score them (dynamic sampling scores as it generates: it
            decides on scores which groups to replace); `rl/asynchronous.py`
            runs it on threads, ahead of the update
  batch     advantages and the training arrays, on the actor mesh
  logps     the frozen reference's and the rollout policy's log-probs,
            and how far the rollout engine's are from the trainer's
  update    mini-batch updates (num_iterations passes over the rollout)
  sync      the new weights to the rollout engine (the runtime's reshard)
  metrics   one step's scalars

A job's loop calls them in order, with preemption checks between them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
import contextlib
import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tunix_pw.rl import batch as batch_lib, functions
from tunix_pw.runtime import reshard, sharding
from tunix_pw.runtime.fetch import fetch
from tunix_pw.sampling.rollout import SamplingConfig
from tunix_pw.train import metrics


SEQUENCES = ('tokens', 'positions', 'segment_ids')  # a forward pass's input


class Timer(dict):
  """Seconds per phase: `with timer('rollout'): ...`."""

  @contextlib.contextmanager
  def __call__(self, phase: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    self[phase] = time.perf_counter() - start


@dataclasses.dataclass(frozen=True)
class Rollout:
  groups: list[batch_lib.Group]
  weights: list[float]  # per group: 0 for dynamic sampling's fillers
  counts: dict[str, int]

  @property
  def real(self) -> list[batch_lib.Group]:
    return [g for g, w in zip(self.groups, self.weights) if w]


def sampling(rl: Any, seed: int = 0) -> SamplingConfig:
  return SamplingConfig(max_new_tokens=rl.max_new_tokens,
                        temperature=rl.temperature, top_k=rl.top_k,
                        top_p=rl.top_p, seed=seed)


def rollout(sampler: Any, data: Any, tokenizer: Any, rl: Any,
            reward_weights: Any, seed: int, step: int,
            scorers: batch_lib.Scorers = batch_lib.Scorers()
            ) -> Callable[[], Rollout]:
  """Generates the step's groups and returns the function that scores them
  (with the model-based scores of `scorers`) into its Rollout; each refill
  round samples with its own seed."""
  score = batch_lib.rollout(
      sampler, data, tokenizer, rl, reward_weights,
      lambda rounds: sampling(rl, seed * 1_000_003 + step * 101 + rounds),
      scorers)
  return lambda: Rollout(*score())


def on_mesh(arrays: dict[str, Any], mesh: Any, rules: Any) -> dict[str, Any]:
  """Host arrays split over `mesh`'s batch axes (every process holds the
  whole rollout: they generated it together)."""
  return {k: jax.device_put(v, sharding.batch(mesh, v.shape, rules))
          for k, v in arrays.items()}


def training_arrays(result: Rollout, rl: Any, length: int,
                    pad_id: int) -> dict[str, np.ndarray]:
  """tokens, masks, positions, weights per sample (host), and the group
  advantages (token advantages come later, from their scorer)."""
  return batch_lib.to_arrays(result.groups, result.weights, length, pad_id,
                             functions.group_advantage(rl.advantage))


def chunked_logps(program: Callable, state: Any, arrays: dict[str, Any],
                  mesh: Any, rules: Any, size: int) -> Any:
  """`program(state, rows)` over the sequences (and their images, a
  vision-language model's), `size` rows at a time (its outputs: an array
  or a dict of them, batch first)."""
  sequences = {k: arrays[k] for k in SEQUENCES + ('images',) if k in arrays}
  return jax.tree.map(lambda *parts: jnp.concatenate(parts), *[
      program(state, on_mesh({k: v[i:i + size] for k, v in sequences.items()},
                             mesh, rules))
      for i in range(0, len(sequences['tokens']), size)])


def rollout_correction(result: Rollout, arrays: dict[str, np.ndarray],
                       old_logps: jax.Array | None, rl: Any
                       ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
  """The rollout engine's log-probabilities against the trainer's at
  rollout time (`old_logps`; an asynchronous rollout's engine served an
  older policy): mismatch metrics, and each token's importance weight at
  --config.rl.is_level, clipped to [is_low, tis_cap] (TIS) or masked
  outside [is_low, mis_threshold] (MIS), with the share of live tokens
  clipped (`tis_clipped`) or masked (`mis_masked`)."""
  if old_logps is None or not (rl.tis_cap or rl.mis_threshold or
                               rl.mismatch_metrics):
    return {}, {}
  old = fetch(old_logps)
  rollout = batch_lib.rollout_logps(result.groups, old.shape[1] + 1)
  mask = arrays['loss_mask'][:, 1:] * (arrays['weights'][:, None] > 0)
  values = {k: float(v) for k, v in
            fetch(functions.mismatch(old, rollout, mask)).items()}
  high = rl.mis_threshold or rl.tis_cap
  if not high:
    return {}, values
  level = rl.is_level or ('sequence' if rl.mis_threshold else 'token')
  weigh = functions.mis_weights if rl.mis_threshold else functions.tis_weights
  weights = weigh(old, rollout, mask, high, rl.is_low, level)
  ratio = np.asarray(functions.is_ratios(old, rollout, mask, level))
  outside = ((ratio < rl.is_low) | (ratio > high)) & (mask > 0)
  key = 'mis_masked' if rl.mis_threshold else 'tis_clipped'
  values[key] = float(outside.sum() / max((mask > 0).sum(), 1))
  return {'is_weights': np.asarray(weights, np.float32)}, values


def to_actor(extra: dict[str, jax.Array], actor_mesh: Any, rules: Any,
             runtime: Any, budget: reshard.Budget) -> dict[str, jax.Array]:
  """Log-probabilities onto the actor mesh, sharded like their batch."""
  moved, _ = reshard.transfer(extra, {
      k: sharding.batch(actor_mesh, v.shape, rules)
      for k, v in extra.items()}, runtime, budget=budget)
  return moved


# Update metrics that describe the state after the step, not an average.
_LAST = ('learning_rate', 'nonfinite_streak')


def update(state: Any, train_step: Callable, batch: dict[str, Any],
           rl: Any, mesh: Any, rules: Any) -> tuple[Any, dict[str, float]]:
  """num_iterations passes of mini-batch updates over the rollout, each
  mini-batch split over `mesh`'s batch axes (a slice of a sharded array
  comes out replicated); the step's metrics over all of them (`combine`)."""
  n = len(batch['tokens'])
  per_update = []
  for _ in range(rl.num_iterations):
    for start in range(0, n, rl.mini_batch_size):
      mini = {k: jax.device_put(v[start:start + rl.mini_batch_size],
                                sharding.batch(mesh, (rl.mini_batch_size,) +
                                               v.shape[1:], rules))
              for k, v in batch.items()}
      state, step_metrics = train_step(state, mini)
      per_update.append(step_metrics)
  return state, combine(fetch(per_update))


def combine(per_update: list[dict[str, Any]]) -> dict[str, float]:
  """One step's update metrics from its mini-batch updates': each loss
  metric (loss, clip_fraction, kl, entropy, ...) averaged with the weight
  its loss was normalised by (tokens for token-level aggregations,
  sequences for sequence-level ones), so the step's figure is that of all
  its tokens; `weight` summed; `grad_norm` the updates' mean; `skipped` the
  updates skipped; the learning rate and the non-finite streak the last."""
  weights = np.array([float(m['weight']) for m in per_update])
  total = weights.sum()
  out = {}
  for key in per_update[0]:
    values = np.array([float(m[key]) for m in per_update])
    if key in _LAST:
      out[key] = values[-1]
    elif key in ('weight', 'skipped'):
      out[key] = values.sum()
    elif key == 'grad_norm' or not total:
      out[key] = values.mean()
    else:  # a loss metric
      out[key] = values @ weights / total
  return {k: float(v) for k, v in out.items()}


def samples(result: Rollout, tokenizer: Any,
            count: int) -> list[dict[str, Any]]:
  """The first `count` prompts of a step with their completions and
  rewards, as text (for samples.jsonl and TensorBoard)."""
  return [dict(prompt=tokenizer.decode(g.prompt), answer=g.answer,
               dataset=g.dataset,
               completions=[tokenizer.decode(c) for c in g.completions],
               rewards=[float(r) for r in g.rewards])
          for g in result.real[:count]]


def _mean(groups: list[batch_lib.Group], name: str) -> float:
  """The mean of reward `name` over the groups scored by it."""
  values = [g.per_reward[name] for g in groups if name in g.per_reward]
  return float(np.concatenate(values).mean()) if values else 0.0


def dataset_metrics(real: list[batch_lib.Group],
                    reward_weights: dict[str, Any]) -> dict[str, float]:
  """A mixture's reward mean and accuracy per dataset."""
  values = {}
  for name, weights in reward_weights.items():
    groups = [g for g in real if g.dataset == name]
    if groups:
      values[f'reward_mean/{name}'] = float(np.concatenate(
          [g.rewards for g in groups]).mean())
      if 'exact_answer' in dict(weights):
        values[f'accuracy/{name}'] = _mean(groups, 'exact_answer')
  return values


def step_metrics(result: Rollout, update_metrics: dict[str, float],
                 timer: Timer, sync: reshard.Stats | None,
                 reward_weights: dict[str, Any]) -> dict[str, float]:
  """One step's scalars: the update's (mismatch metrics included), timings,
  rollout counts, rewards (per dataset too, for a mixture)."""
  real, counts = result.real, result.counts
  rewards = np.concatenate([g.rewards for g in real]) if real else np.zeros(1)
  names = {n: w for weights in reward_weights.values() for n, w in weights}

  counts = dict(counts)
  values = dict(update_metrics, **{f'time/{k}': v for k, v in timer.items()})
  if 'truncated_nats' in counts:  # what top-k/top-p cut, per token
    values['mismatch/truncation_kl'] = counts.pop('truncated_nats') / max(
        counts['generated'], 1)
  values.update(counts)
  values.update(
      reward_mean=float(rewards.mean()), reward_std=float(rewards.std()),
      kept_group_fraction=len(real) / max(len(real) + counts['dropped'], 1),
      response_length=float(np.mean([len(c) for g in real
                                     for c in g.completions] or [0])),
      rollout_tokens_per_s=counts['generated'] / timer['rollout'],
      sync_bytes=sync.bytes if sync else 0,
      compilations=metrics.compilations(),
      **{f'reward/{name}': _mean(real, name) for name in names})
  if real and 'exact_answer' in names:
    values['accuracy'] = _mean(real, 'exact_answer')
  if len(reward_weights) > 1:
    values.update(dataset_metrics(real, reward_weights))
  return values
