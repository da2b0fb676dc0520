"""The policy-gradient loss of the GRPO family and PPO, assembled from the
registered functions a config names."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from tunix_pw.runtime.sharding import Sharder
from tunix_pw.rl import functions  # pylint: disable=unused-import (registers)
from tunix_pw.rl import registry


def token_logps(model, tokens, positions, segments,
                shard: Sharder = Sharder()):
  """log p(token t+1 | ...) at every position [N, T-1], and the entropy;
  `shard` keeps the activations on the mesh's data axes."""
  logits, _ = model(tokens, positions, segments, shard=shard)
  # Reductions over the vocabulary only, which XLA fuses: no [N, T, V]
  # log-softmax is materialised. All T positions, cut to T-1 once reduced: a
  # slice of the sharded logits trips the TPU compiler (libtpu 0.0.42).
  logits = logits.astype(jnp.float32)
  normaliser = jax.nn.logsumexp(logits, axis=-1)
  targets = jnp.roll(tokens, -1, axis=1)
  chosen = jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
  mean_logit = (jnp.exp(logits - normaliser[..., None]) * logits).sum(-1)
  return (chosen - normaliser)[:, :-1], (normaliser - mean_logit)[:, :-1]


def rl_loss(model, batch, rng, *, rl: Any, shard: Sharder = Sharder()):
  """The registered policy loss (+ KL), aggregated; metric sums weighted so
  the step's division yields batch averages."""
  del rng
  logp, entropy = token_logps(model, batch['tokens'], batch['positions'],
                              batch['segment_ids'], shard)
  mask = batch['loss_mask'][:, 1:].astype(jnp.float32)
  old = batch.get('old_logps', jax.lax.stop_gradient(logp))
  per_token, clipped = registry.get('policy_loss', rl.policy_loss)(
      logp, old, batch['advantages'], mask, rl.eps_low, rl.eps_high)
  if 'tis_weights' in batch:  # the rollout engine's tokens, reweighted
    per_token = per_token * batch['tis_weights']
  kl = jnp.zeros_like(logp)
  if 'ref_logps' in batch and not rl.get('kl_in_reward', False):
    kl = registry.get('kl', rl.kl)(logp, batch['ref_logps'])
    per_token = per_token + rl.kl_beta * kl
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
                    entropy=(entropy * live).sum() * share)
