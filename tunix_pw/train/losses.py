"""Preference losses, registered beside the RL functions
(`@register('preference_loss', name)`), as pure functions of per-sequence
log-probabilities: a `Pair` holds the policy's summed completion
log-probabilities and completion lengths for chosen and rejected
completions, and the frozen reference's sums (none for ORPO). SFT's loss is
token-level (`train.step.token_nll`).

- DPO (Rafailov et al. 2023, arXiv 2305.18290), sigmoid:
  -log sigmoid(beta * ((pi_c - pi_r) - (ref_c - ref_r)))
- IPO (Azar et al. 2023, arXiv 2310.12036):
  ((pi_c - pi_r) - (ref_c - ref_r) - 1 / (2 beta))^2
- ORPO (Hong et al. 2024, arXiv 2403.07691), no reference: the chosen NLL
  plus lambda * -log sigmoid(log odds_c - log odds_r), with the odds of the
  mean per-token probability p: log(p / (1 - p)).

A reward model's Bradley-Terry loss takes its scores instead.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tunix_pw.rl.registry import register


class Pair(NamedTuple):
  """Per pair [B]: summed completion log-probabilities and lengths."""
  chosen: jax.Array
  chosen_tokens: jax.Array
  rejected: jax.Array
  rejected_tokens: jax.Array
  ref_chosen: jax.Array | None = None
  ref_rejected: jax.Array | None = None


def margin(pair: Pair) -> jax.Array:
  return ((pair.chosen - pair.rejected) -
          (pair.ref_chosen - pair.ref_rejected))


@register('preference_loss', 'dpo')
def dpo(pair: Pair, beta: float, lam: float) -> jax.Array:
  del lam
  return -jax.nn.log_sigmoid(beta * margin(pair))


@register('preference_loss', 'ipo')
def ipo(pair: Pair, beta: float, lam: float) -> jax.Array:
  del lam
  return (margin(pair) - 1.0 / (2.0 * beta)) ** 2


def bradley_terry(chosen: jax.Array, rejected: jax.Array) -> jax.Array:
  """A reward model's loss per pair from its scores: -log sigmoid(s_c -
  s_r), the Bradley-Terry likelihood (Bradley & Terry 1952) as the reward
  models of Ouyang et al. 2022 (arXiv 2203.02155, eq. 1) train it."""
  return -jax.nn.log_sigmoid(chosen - rejected)


def log_odds(mean_logp: jax.Array) -> jax.Array:
  """log(p / (1 - p)) for p = exp(mean_logp), stably."""
  return mean_logp - jnp.log1p(-jnp.exp(jnp.minimum(mean_logp, -1e-6)))


@register('preference_loss', 'orpo')
def orpo(pair: Pair, beta: float, lam: float) -> jax.Array:
  """ORPO per pair: NLL of the chosen completion (per token) plus lambda
  times the odds-ratio term."""
  del beta
  chosen_mean = pair.chosen / pair.chosen_tokens
  rejected_mean = pair.rejected / pair.rejected_tokens
  ratio = -jax.nn.log_sigmoid(log_odds(chosen_mean) - log_odds(rejected_mean))
  return -chosen_mean + lam * ratio
