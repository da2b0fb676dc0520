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
                chunk: int = 0, also: tuple[Any, Any] | None = None,
                images: jax.Array | None = None):
  """log p(token t+1 | ...) at every position [N, T-1], and the entropy,
  of softmax(logits / temperature): the distribution the sampler draws
  from at that temperature (before top-k and top-p), so that the
  rollout's, the old, the current and the reference log-probabilities all
  describe one policy. `shard` keeps the activations on the mesh's data
  axes. The logits exist `rl.logits_chunk` positions at a time
  (`step_lib.next_token_stats`), never [N, T, V] whole; `also` (fn,
  inputs): fn(logits, inputs at the same positions), returned third.
  `images`: each row's (a vision-language model's)."""
  out = step_lib.next_token_stats(
      model, tokens, positions, segments,
      lambda logits, targets: logp_entropy(logits, targets, temperature),
      shard=shard, chunk=chunk, also=also, images=images)
  return jax.tree.map(lambda a: a[:, :-1], out)


def logp_entropy(logits: jax.Array, targets: jax.Array, temperature: float
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
  teacher = {k: v for k, v in batch.items()
             if k in distill_losses.TEACHER_LOGITS}
  logp, entropy, *kd = token_logps(
      model, batch['tokens'], batch['positions'], batch['segment_ids'],
      shard, rl.temperature, rl.logits_chunk,
      (lambda logits, t: distill_losses.logit_divergence(logits, t, distill),
       teacher) if teacher else None, batch.get('images'))
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
  if teacher:  # the whole distributions are compared
    per_token = per_token + distill.weight * kd[0]
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
                    **({'distill': (kd[0] * live).sum() * share}
                       if teacher else {}))
