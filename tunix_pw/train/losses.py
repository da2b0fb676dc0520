"""Training losses as pure functions of per-sequence log-probabilities.

SFT is token-level (see step.token_nll). Preference losses take the summed
completion log-probabilities of the policy (and of a frozen reference) for
chosen and rejected completions:

- DPO (Rafailov et al. 2023, arXiv 2305.18290), sigmoid:
  -log sigmoid(beta * ((pi_c - pi_r) - (ref_c - ref_r)))
- IPO (Azar et al. 2023, arXiv 2310.12036):
  ((pi_c - pi_r) - (ref_c - ref_r) - 1 / (2 beta))^2
- ORPO (Hong et al. 2024, arXiv 2403.07691), no reference: the chosen NLL
  plus lambda * -log sigmoid(log odds_c - log odds_r), with the odds of the
  mean per-token probability p: log(p / (1 - p)).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PREFERENCE_LOSSES = ('dpo', 'ipo', 'orpo')


def dpo(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
        beta: float) -> jax.Array:
  margin = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
  return -jax.nn.log_sigmoid(beta * margin)


def ipo(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
        beta: float) -> jax.Array:
  margin = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
  return (margin - 1.0 / (2.0 * beta)) ** 2


def log_odds(mean_logp: jax.Array) -> jax.Array:
  """log(p / (1 - p)) for p = exp(mean_logp), stably."""
  return mean_logp - jnp.log1p(-jnp.exp(jnp.minimum(mean_logp, -1e-6)))


def orpo(chosen_sum, chosen_tokens, rejected_sum, rejected_tokens,
         lam: float) -> jax.Array:
  """ORPO per pair: NLL of the chosen completion (per token) plus lambda
  times the odds-ratio term."""
  chosen_mean = chosen_sum / chosen_tokens
  rejected_mean = rejected_sum / rejected_tokens
  ratio = -jax.nn.log_sigmoid(log_odds(chosen_mean) - log_odds(rejected_mean))
  return -chosen_mean + lam * ratio
