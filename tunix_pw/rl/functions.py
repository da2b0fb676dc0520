"""The policy-gradient family's math: advantages, policy losses, loss
aggregation, KL estimators and the rollout/trainer mismatch correction, as
small registered functions of arrays.

Shapes: rewards [P, G] (P prompts, G generations each); per-token arrays
[N, T] over N = P * G sequences, `mask` marking completion tokens.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses

import jax
import jax.numpy as jnp

from tunix_pw import registry
from tunix_pw.registry import register

EPS = 1e-6


# ---------------------------------------------------------------- advantages


@register('advantage', 'grpo')
def grpo_advantage(rewards: jax.Array) -> jax.Array:
  """DeepSeekMath (arXiv 2402.03300, eq. 3): (r - mean) / std per group."""
  mean = rewards.mean(axis=1, keepdims=True)
  std = rewards.std(axis=1, keepdims=True)
  return (rewards - mean) / (std + EPS)


@register('advantage', 'drgrpo')
def drgrpo_advantage(rewards: jax.Array) -> jax.Array:
  """Dr. GRPO (arXiv 2503.20783): r - mean, without the std division."""
  return rewards - rewards.mean(axis=1, keepdims=True)


@register('advantage', 'rloo')
def rloo_advantage(rewards: jax.Array) -> jax.Array:
  """RLOO (Ahmadian et al. 2024): r_i minus the mean of the others."""
  g = rewards.shape[1]
  others = (rewards.sum(axis=1, keepdims=True) - rewards) / (g - 1)
  return rewards - others


def _whiten(x: jax.Array) -> jax.Array:
  return (x - x.mean()) / (x.std() + EPS)


@register('advantage', 'reinforce++')
def reinforce_pp_advantage(rewards: jax.Array) -> jax.Array:
  """REINFORCE++ (Hu et al. 2025, arXiv 2501.03262, eq. 9-10): no critic
  and no group baseline; the rewards normalised over the whole batch."""
  return _whiten(rewards)


@register('advantage', 'reinforce++-baseline')
def reinforce_pp_baseline_advantage(rewards: jax.Array) -> jax.Array:
  """REINFORCE++-baseline (arXiv 2501.03262, sec. 3.3): the group mean
  subtracted, then normalised over the whole batch (a batch std, not a
  group std: no blow-up on groups of nearly equal rewards)."""
  return _whiten(drgrpo_advantage(rewards))


@dataclasses.dataclass(frozen=True)
class TokenAdvantage:
  """Advantages each token gets after the rollout from another model's
  scores, not from its group's rewards: registered beside the group
  advantages, as what a job needs for them."""

  scorer: str  # the config block of the model that scores the tokens
  setup: str  # how a config gets that model (for the error naming it)
  needs: tuple[str, ...] = ()  # the per-token arrays an update needs
  # (teacher's, student's log-probabilities) -> the advantages; None: the
  # job computes them with its scorer (PPO's critic, by `gae` below).
  of_logps: Callable[[jax.Array, jax.Array], jax.Array] | None = None


register('advantage', 'gae')(TokenAdvantage(
    'critic', 'train with tunix_pw/configs/ppo.py'))
# On-policy distillation's: log pi_teacher - log pi_student of each sampled
# token (the negative of the per-token reverse KL).
register('advantage', 'on_policy_distill')(TokenAdvantage(
    'teacher', 'use tunix_pw/configs/grpo.py:<preset>,distill and name it '
    'in --config.teacher', ('ref_logps', 'old_logps'),
    lambda teacher, student: teacher - student))


def token_advantage(name: str) -> TokenAdvantage | None:
  """The registered advantage `name` if it is a token advantage."""
  found = (registry.get('advantage', name)
           if name in registry.names('advantage') else None)
  return found if isinstance(found, TokenAdvantage) else None


def group_advantage(name: str) -> Callable[[jax.Array], jax.Array] | None:
  """The registered advantage `name` if it is of a group's rewards."""
  return None if token_advantage(name) else registry.get('advantage', name)


# ------------------------------------------------------------ policy losses


@register('policy_loss', 'ppo_clip')
def ppo_clip(logp, old_logp, advantages, mask, eps_low: float,
             eps_high: float):
  """PPO's clipped surrogate per token, with separate low/high epsilons
  (DAPO's clip-higher, arXiv 2503.14476, eq. 8). Returns (loss [N, T],
  clipped [N, T])."""
  ratio = jnp.exp(logp - old_logp)
  adv = per_token(advantages)
  unclipped = ratio * adv
  clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
  del mask
  return -jnp.minimum(unclipped, clipped), (clipped < unclipped)


def per_token(advantages: jax.Array) -> jax.Array:
  """[N] sequence advantages (the group family's) or [N, T] token ones
  (PPO's GAE), broadcastable against [N, T]."""
  return advantages if advantages.ndim == 2 else advantages[:, None]


@register('policy_loss', 'gspo_token')
def gspo_token(logp, old_logp, advantages, mask, eps_low: float,
               eps_high: float):
  """GSPO-token (arXiv 2507.18071, eq. 13-14): the sequence's length-
  normalised ratio s_i, carried per token as sg[s_i] * pi / sg[pi], clipped
  at the sequence level."""
  log_ratio = ((logp - old_logp) * mask).sum(-1) / jnp.maximum(
      mask.sum(-1), 1.0)
  seq = jnp.exp(jax.lax.stop_gradient(log_ratio))[:, None]
  ratio = seq * jnp.exp(logp - jax.lax.stop_gradient(logp))
  adv = per_token(advantages)
  unclipped = ratio * adv
  clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
  return -jnp.minimum(unclipped, clipped), (clipped < unclipped)


@register('policy_loss', 'cispo')
def cispo(logp, old_logp, advantages, mask, eps_low: float,
          eps_high: float):
  """CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4-5): the importance weight
  is clipped and stopped, never the token: -sg(clip(r, 1 - eps_low,
  1 + eps_high)) A log pi, so every token keeps its gradient."""
  del mask
  ratio = jnp.exp(logp - old_logp)
  weight = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - eps_low,
                                          1.0 + eps_high))
  outside = (ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high)
  return -weight * per_token(advantages) * logp, outside


# ---------------------------------------------------------- PPO with a critic
# Token-level arrays [N, T] over the completion tokens (`mask`); position t
# holds the reward of choosing token t + 1 and V(s_t), the value of the
# prefix through token t.


def gae(rewards, values, mask, gamma: float, lam: float):
  """Generalized advantage estimation (Schulman et al. 2016, arXiv
  1506.02438, eq. 16): delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t +
  gamma lambda A_{t+1}, with V and A zero after the last completion token.
  Returns (advantages, returns = A + V), zero outside the mask."""

  def back(carry, xs):
    next_value, next_advantage = carry
    r, v, m = xs
    advantage = (r + gamma * next_value - v + gamma * lam * next_advantage)
    return (v * m, advantage * m), advantage * m

  _, advantages = jax.lax.scan(
      back, (jnp.zeros(rewards.shape[0]), jnp.zeros(rewards.shape[0])),
      (rewards.T, values.T, mask.T), reverse=True)
  advantages = advantages.T
  return advantages, (advantages + values) * mask


def whiten(x, mask):
  """x standardised over the masked entries of the whole batch (PPO's
  advantage normalisation); zero outside the mask."""
  count = jnp.maximum(mask.sum(), 1.0)
  mean = (x * mask).sum() / count
  var = (((x - mean) * mask) ** 2).sum() / count
  return (x - mean) * jax.lax.rsqrt(var + 1e-8) * mask


def value_loss(values, old_values, returns, clip: float):
  """PPO's clipped value loss per token (Schulman et al. 2017, as in
  OpenAI baselines' ppo2): 0.5 max((V - R)^2, (V_old + clip(V - V_old,
  -c, c) - R)^2); c = 0 turns the clip off. Returns (loss, clipped)."""
  plain = (values - returns) ** 2
  if not clip:
    return 0.5 * plain, jnp.zeros_like(plain, bool)
  bounded = old_values + jnp.clip(values - old_values, -clip, clip)
  clipped = (bounded - returns) ** 2
  return 0.5 * jnp.maximum(plain, clipped), clipped > plain


# ------------------------------------------- rollout/trainer mismatch (TIS)


IS_LEVELS = ('token', 'sequence', 'geometric')


def is_ratios(trainer_logp, rollout_logp, mask, level: str):
  """Each live token's importance ratio pi_old / pi_rollout [N, T] at
  `level`: its own (token), its sequence's product over the live tokens
  (sequence), or that product's geometric mean (geometric: length-free, so
  long sequences are not masked for their length alone)."""
  d = (trainer_logp - rollout_logp) * mask
  if level == 'token':
    return jnp.exp(d)
  total = d.sum(-1, keepdims=True)
  if level == 'geometric':
    total = total / jnp.maximum(mask.sum(-1, keepdims=True), 1.0)
  return jnp.broadcast_to(jnp.exp(total), d.shape)


def tis_weights(trainer_logp, rollout_logp, mask, cap: float,
                low: float = 0.0, level: str = 'token'):
  """Truncated importance sampling (Yao et al. 2025, "Your Efficient RL
  Framework Secretly Brings You Off-Policy RL Training"): the rollout
  engine sampled from pi_rollout, the trainer's gradient assumes pi_old;
  each token's loss is weighted by its ratio at `level`, clipped to
  [low, cap]."""
  ratio = is_ratios(trainer_logp, rollout_logp, mask, level)
  return jnp.clip(ratio, low, cap) * mask


def mis_weights(trainer_logp, rollout_logp, mask, threshold: float,
                low: float = 0.0, level: str = 'sequence'):
  """Masked importance sampling (Liu et al. 2025, "When Speed Kills
  Stability"): the ratio at `level` weights each token's loss, and a
  ratio outside [low, threshold] masks it out (at the sequence and
  geometric levels the whole sequence: a stale or mismatched sample is
  rejected, not truncated)."""
  ratio = is_ratios(trainer_logp, rollout_logp, mask, level)
  return jnp.where((ratio >= low) & (ratio <= threshold), ratio, 0.0) * mask


def mismatch(trainer_logp, rollout_logp, mask) -> dict[str, jax.Array]:
  """How far the rollout engine's token log-probabilities are from the
  trainer's: KL(pi_rollout || pi_old) by the k3 estimator over the sampled
  tokens, and quantiles of the ratio pi_old / pi_rollout."""
  d = trainer_logp - rollout_logp
  live = mask > 0
  kl = jnp.where(live, jnp.expm1(d) - d, 0.0).sum() / jnp.maximum(
      live.sum(), 1)
  q = jnp.nanquantile(jnp.where(live, jnp.exp(d), jnp.nan),
                      jnp.array([0.05, 0.5, 0.95]))
  return {'mismatch/kl': kl, 'mismatch/ratio_p05': q[0],
          'mismatch/ratio_p50': q[1], 'mismatch/ratio_p95': q[2]}


# -------------------------------------------------------------- aggregation
# Each returns (loss summed over this batch, the count it is normalised by):
# the train step sums both over micro batches before dividing.


@register('aggregation', 'token-mean')
def token_mean(per_token, mask, weights, max_length):
  """DAPO: every token counts the same across the batch."""
  del max_length
  m = mask * weights[:, None]
  return (per_token * m).sum(), m.sum()


@register('aggregation', 'sequence-mean-token-mean')
def sequence_mean_token_mean(per_token, mask, weights, max_length):
  """GRPO: the mean over tokens per sequence, then over sequences."""
  del max_length
  per_seq = (per_token * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0)
  return (per_seq * weights).sum(), weights.sum()


@register('aggregation', 'sequence-mean-token-scale')
def sequence_mean_token_scale(per_token, mask, weights, max_length):
  """Dr. GRPO: token sums divided by a constant (the generation budget),
  then the mean over sequences: no length bias."""
  per_seq = (per_token * mask).sum(-1) / max_length
  return (per_seq * weights).sum(), weights.sum()


# ------------------------------------------------------------ KL estimators
# Schulman's estimators of KL(pi || ref) from samples of pi
# (http://joschu.net/blog/kl-approx.html); d = ref_logp - logp.


@register('kl', 'k1')
def kl_k1(logp, ref_logp):
  return logp - ref_logp


@register('kl', 'k2')
def kl_k2(logp, ref_logp):
  return 0.5 * (logp - ref_logp) ** 2


@register('kl', 'k3')
def kl_k3(logp, ref_logp):
  """The low-variance estimator GRPO uses (arXiv 2402.03300, eq. 4)."""
  d = ref_logp - logp
  return jnp.exp(d) - d - 1.0
