"""Each registered advantage, policy loss, aggregation and KL estimator
equals a hand computation of its published formula on small arrays."""

import jax.numpy as jnp
import numpy as np
import pytest

from tunix_pw.errors import UsageError
from tunix_pw.rl import functions as f
from tunix_pw.rl import registry

REWARDS = jnp.array([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 5.0]])


def test_grpo_advantage():
  # DeepSeekMath (Shao et al. 2024, arXiv 2402.03300), sec. 4.1.2:
  # A_i = (r_i - mean(r)) / std(r) within each group.
  expected = np.array([[1, -1, -1, 1], [-1 / np.sqrt(3)] * 3 + [np.sqrt(3)]])
  np.testing.assert_allclose(f.grpo_advantage(REWARDS), expected, atol=1e-5)


def test_drgrpo_advantage():
  # Dr. GRPO (Liu et al. 2025, arXiv 2503.20783), eq. 3: r_i - mean(r).
  np.testing.assert_allclose(f.drgrpo_advantage(REWARDS),
                             [[0.5, -0.5, -0.5, 0.5],
                              [-0.75, -0.75, -0.75, 2.25]], atol=1e-6)


def test_rloo_advantage():
  # RLOO (Ahmadian et al. 2024, arXiv 2402.14740), eq. 5:
  # r_i - 1/(G-1) * sum_{j != i} r_j.
  np.testing.assert_allclose(f.rloo_advantage(REWARDS),
                             [[2 / 3, -2 / 3, -2 / 3, 2 / 3],
                              [-1.0, -1.0, -1.0, 3.0]], atol=1e-6)


def test_ppo_clip_with_separate_epsilons():
  # PPO (Schulman et al. 2017) surrogate with DAPO's clip-higher
  # (Yu et al. 2025, arXiv 2503.14476, eq. 8):
  # -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A).
  ratios = np.array([[0.5, 1.0, 1.5]])
  logp, old = jnp.log(jnp.asarray(ratios)), jnp.zeros((1, 3))
  for adv in (2.0, -2.0):
    loss, clipped = f.ppo_clip(logp, old, jnp.array([adv]), jnp.ones((1, 3)),
                               eps_low=0.2, eps_high=0.28)
    bounded = np.clip(ratios, 0.8, 1.28)
    np.testing.assert_allclose(
        loss, -np.minimum(ratios * adv, bounded * adv), rtol=1e-6)
    # Clipping binds where the clipped term is the smaller one.
    assert clipped.tolist() == [[adv < 0, False, adv > 0]]


def test_gspo_token_sequence_ratio():
  # GSPO (Zheng et al. 2025, arXiv 2507.18071), eq. 13-14: s_i is the
  # geometric mean of the token ratios over the response; GSPO-token
  # carries its value on every token and clips at 1 -+ eps.
  logp = jnp.log(jnp.array([[1.2, 1.1, 9.0], [0.9, 0.9, 0.9]]))
  old = jnp.zeros((2, 3))
  mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # 3rd token padding
  adv = jnp.array([1.0, 1.0])
  loss, clipped = f.gspo_token(logp, old, adv, mask, eps_low=3e-4,
                               eps_high=4e-4)
  s = np.array([np.sqrt(1.2 * 1.1), 0.9])
  expected = -np.minimum(s, np.clip(s, 1 - 3e-4, 1 + 4e-4))[:, None] * \
      np.ones((2, 3))
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  assert np.asarray(clipped)[0].all() and not np.asarray(clipped)[1].any()


def test_aggregations():
  per_token = jnp.array([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
  mask = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
  weights = jnp.array([1.0, 1.0])
  # DAPO token-mean: (1 + 2 + 3 + 4) / 4 tokens.
  total, count = f.token_mean(per_token, mask, weights, 4)
  assert float(total / count) == pytest.approx(2.5)
  # GRPO: mean over sequences of per-sequence token means: (2 + 4) / 2.
  total, count = f.sequence_mean_token_mean(per_token, mask, weights, 4)
  assert float(total / count) == pytest.approx(3.0)
  # Dr. GRPO: token sums over the constant budget 4: (6/4 + 4/4) / 2.
  total, count = f.sequence_mean_token_scale(per_token, mask, weights, 4)
  assert float(total / count) == pytest.approx(1.25)
  # A zero-weight (padding) sequence contributes nothing.
  total, count = f.sequence_mean_token_mean(per_token, mask,
                                            jnp.array([1.0, 0.0]), 4)
  assert float(total / count) == pytest.approx(2.0)


def test_kl_estimators():
  # Schulman, "Approximating KL divergence" (2020): with d = ref - logp,
  # k1 = -d, k2 = d^2 / 2, k3 = exp(d) - d - 1.
  logp, ref = jnp.log(jnp.array([0.5, 0.2])), jnp.log(jnp.array([0.25, 0.4]))
  d = np.log([0.25, 0.4]) - np.log([0.5, 0.2])
  np.testing.assert_allclose(f.kl_k1(logp, ref), -d, rtol=1e-6)
  np.testing.assert_allclose(f.kl_k2(logp, ref), d ** 2 / 2, rtol=1e-6)
  np.testing.assert_allclose(f.kl_k3(logp, ref), np.exp(d) - d - 1,
                             rtol=1e-5)


def test_unknown_names_are_config_errors():
  with pytest.raises(UsageError, match="'ppo' is not a registered"):
    registry.check('policy_loss', 'ppo', '--config.rl.policy_loss')
  assert registry.names('advantage') == ['drgrpo', 'grpo', 'rloo']
