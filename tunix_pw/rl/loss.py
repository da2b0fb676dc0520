"""The policy-gradient loss of the GRPO family and PPO, assembled from the
registered functions a config names."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from tunix_pw import registry
from tunix_pw.runtime.sharding import Sharder
from tunix_pw.rl import functions  # pylint: disable=unused-import (registers)
from tunix_pw.train import distill_losses
from tunix_pw.train import step as step_lib


def token_logps(model, tokens, positions, segments,
                shard: Sharder = Sharder(), temperature: float = 1.0,
                chunk: int = 0):
  """log p(token t+1 | ...) at every position [N, T-1], and the entropy,
  of the policy at `temperature`; `shard` keeps the activations on the
  mesh's data axes. The logits exist `rl.logits_chunk` positions at a
  time (`step_lib.by_chunks`), never [N, T, V] whole."""
  x, _ = model.hidden(tokens, positions, segments, shard=shard)
  step = step_lib.chunk_size(model.cfg.vocab_size, chunk)
  if step >= x.shape[1]:
    return logps_of(model.logits(x, shard), tokens, temperature)
  logp, entropy = step_lib.by_chunks(
      model, x, jnp.roll(tokens, -1, axis=1),
      lambda logits, targets: _stats(logits, targets, temperature), step,
      shard)
  return logp[:, :-1], entropy[:, :-1]


def logps_of(logits: jax.Array, tokens: jax.Array, temperature: float = 1.0
             ) -> tuple[jax.Array, jax.Array]:
  """`token_logps` from the logits [N, T, V]: of softmax(logits / T), the
  distribution the sampler draws from at temperature T (before top-k and
  top-p), so that the rollout's, the old, the current and the reference
  log-probabilities all describe one policy."""
  # All T positions, cut to T-1 once reduced: a slice of the sharded logits
  # trips the TPU compiler (libtpu 0.0.42).
  logp, entropy = _stats(logits, jnp.roll(tokens, -1, axis=1), temperature)
  return logp[:, :-1], entropy[:, :-1]


def _stats(logits: jax.Array, targets: jax.Array, temperature: float
           ) -> tuple[jax.Array, jax.Array]:
  """log p(targets) and the entropy at each position of softmax(logits /
  temperature). Reductions over the vocabulary only, which XLA fuses: no
  log-softmax is materialised."""
  logits = logits.astype(jnp.float32)
  if temperature != 1.0:
    logits = logits / temperature
  normaliser = jax.nn.logsumexp(logits, axis=-1)
  chosen = jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
  mean_logit = (jnp.exp(logits - normaliser[..., None]) * logits).sum(-1)
  return chosen - normaliser, normaliser - mean_logit


def rl_loss(model, batch, rng, *, rl: Any, distill: Any = None,
            shard: Sharder = Sharder()):
  """The registered policy loss (+ KL), aggregated; metric sums weighted so
  the step's division yields batch averages. With a teacher's logits in
  the batch (on-policy distillation's `distill.weight`), each sampled
  position adds weight x the divergence of the whole next-token
  distributions (GKD's on-policy term, Agarwal et al. 2024)."""
  del rng
  if 'teacher_logits' in batch:  # the whole distributions are compared
    logits, _ = model(batch['tokens'], batch['positions'],
                      batch['segment_ids'], shard=shard)
    logp, entropy = logps_of(logits, batch['tokens'], rl.temperature)
  else:
    logp, entropy = token_logps(model, batch['tokens'], batch['positions'],
                                batch['segment_ids'], shard, rl.temperature,
                                rl.logits_chunk)
  mask = batch['loss_mask'][:, 1:].astype(jnp.float32)
  old = batch.get('old_logps', jax.lax.stop_gradient(logp))
  per_token, clipped = registry.get('policy_loss', rl.policy_loss)(
      logp, old, batch['advantages'], mask, rl.eps_low, rl.eps_high)
  if 'is_weights' in batch:  # the rollout engine's tokens, reweighted
    per_token = per_token * batch['is_weights']
  kl = jnp.zeros_like(logp)
  if 'ref_logps' in batch and not rl.get('kl_in_reward', False):
    kl = registry.get('kl', rl.kl)(logp, batch['ref_logps'])
    per_token = per_token + rl.kl_beta * kl
  kd = jnp.zeros_like(logp)
  if 'teacher_logits' in batch:
    kd = distill_losses.logit_loss(logits, batch, distill)
    per_token = per_token + distill.weight * kd
  if rl.get('entropy_coef', 0.0):  # a bonus: higher entropy, lower loss
    per_token = per_token - rl.entropy_coef * entropy
  aggregate = registry.get('aggregation', rl.aggregation)
  loss, weight = aggregate(per_token, mask, batch['weights'],
                           rl.max_new_tokens)
  live = mask * batch['weights'][:, None]
  share = weight / jnp.maximum(live.sum(), 1.0)  # token average x weight
  return loss, dict(weight=weight,
                    clip_fraction=(clipped * live).sum() * share,
                    kl=(kl * live).sum() * share,
                    entropy=(entropy * live).sum() * share,
                    **({'distill': (kd * live).sum() * share}
                       if 'teacher_logits' in batch else {}))
