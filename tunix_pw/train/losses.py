"""Preference losses as pure functions of per-sequence log-probabilities
(the algorithms that use them are registered in `preference.py`): a
`Pair` holds the policy's summed completion log-probabilities and
completion lengths for chosen and rejected completions, and the frozen
reference's sums (none for ORPO). SFT's loss is
token-level (`train.step.token_nll`).

- DPO (Rafailov et al. 2023, arXiv 2305.18290), sigmoid:
  -log sigmoid(beta * ((pi_c - pi_r) - (ref_c - ref_r)))
- IPO (Azar et al. 2023, arXiv 2310.12036):
  ((pi_c - pi_r) - (ref_c - ref_r) - 1 / (2 beta))^2
- ORPO (Hong et al. 2024, arXiv 2403.07691), no reference: the chosen NLL
  plus lambda * -log sigmoid(log odds_c - log odds_r), with the odds of the
  mean per-token probability p: log(p / (1 - p)).
- KTO (Ethayarajh et al. 2024, arXiv 2402.01306, eq. 8) on unpaired
  examples (`Unpaired`): with r = pi - ref of a completion and z0 = the
  batch's mean r over mismatched (prompt, another row's completion) pairs,
  floored at 0 and held constant, lambda_D * (1 - sigmoid(beta (r - z0)))
  for a desirable completion, lambda_U * (1 - sigmoid(beta (z0 - r))) for
  an undesirable one.

A reward model's Bradley-Terry loss takes its scores instead.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Pair(NamedTuple):
  """Per pair [B]: summed completion log-probabilities and lengths."""
  chosen: jax.Array
  chosen_tokens: jax.Array
  rejected: jax.Array
  rejected_tokens: jax.Array
  ref_chosen: jax.Array | None = None
  ref_rejected: jax.Array | None = None


class Unpaired(NamedTuple):
  """Per example [B]: the summed completion log-probabilities of the
  policy and the reference, the same for the mismatched sequence (the
  example's prompt with another example's completion), and the label."""
  logps: jax.Array
  ref_logps: jax.Array
  mismatched: jax.Array
  ref_mismatched: jax.Array
  desirable: jax.Array  # 1.0 desirable, 0.0 undesirable


def margin(pair: Pair) -> jax.Array:
  return ((pair.chosen - pair.rejected) -
          (pair.ref_chosen - pair.ref_rejected))


def dpo(pair: Pair, beta: float, lam: float) -> jax.Array:
  del lam
  return -jax.nn.log_sigmoid(beta * margin(pair))


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


def orpo(pair: Pair, beta: float, lam: float) -> jax.Array:
  """ORPO per pair: NLL of the chosen completion (per token) plus lambda
  times the odds-ratio term."""
  del beta
  chosen_mean = pair.chosen / pair.chosen_tokens
  rejected_mean = pair.rejected / pair.rejected_tokens
  ratio = -jax.nn.log_sigmoid(log_odds(chosen_mean) - log_odds(rejected_mean))
  return -chosen_mean + lam * ratio


def kto_reference_point(batch: Unpaired) -> jax.Array:
  """z0: KTO's estimate of KL(policy || reference), the mean log-ratio of
  the mismatched completions, floored at 0; no gradient flows through it."""
  return jax.lax.stop_gradient(jnp.maximum(
      (batch.mismatched - batch.ref_mismatched).mean(), 0.0))


def kto(batch: Unpaired, beta: float, lambda_desirable: float,
        lambda_undesirable: float) -> jax.Array:
  """KTO per example: lambda_y - v(x, y)."""
  reward = batch.logps - batch.ref_logps
  z0 = kto_reference_point(batch)
  desirable = lambda_desirable * (1.0 - jax.nn.sigmoid(beta * (reward - z0)))
  undesirable = lambda_undesirable * (
      1.0 - jax.nn.sigmoid(beta * (z0 - reward)))
  return jnp.where(batch.desirable > 0, desirable, undesirable)
