"""Each registered advantage, policy loss, aggregation and KL estimator
equals a hand computation of its published formula on small arrays."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tunix_pw import registry
from tunix_pw.errors import UsageError
from tunix_pw.rl import functions as f

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


def test_reinforce_pp_advantages():
  # REINFORCE++ (Hu et al. 2025, arXiv 2501.03262), eq. 10: rewards
  # normalised by the mean and std of the whole batch (8 values here).
  r = np.asarray(REWARDS)
  np.testing.assert_allclose(f.reinforce_pp_advantage(REWARDS),
                             (r - r.mean()) / r.std(), atol=1e-5)
  # REINFORCE++-baseline (sec. 3.3): r - group mean, then the batch
  # normalisation. Group 0's centred values are +-0.5, group 1's -0.75 x3
  # and 2.25: batch mean 0, std sqrt((4 * 0.25 + 3 * 0.5625 + 5.0625) / 8).
  centred = np.array([[0.5, -0.5, -0.5, 0.5], [-0.75, -0.75, -0.75, 2.25]])
  std = np.sqrt((4 * 0.25 + 3 * 0.5625 + 5.0625) / 8)
  np.testing.assert_allclose(f.reinforce_pp_baseline_advantage(REWARDS),
                             centred / std, atol=1e-5)


def test_cispo_stops_and_clips_the_weight_never_the_token():
  # CISPO (MiniMax 2025, arXiv 2506.13585), eq. 4-5:
  # J = sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi, per token.
  ratios, adv = np.array([[0.5, 1.0, 1.5]]), 2.0
  old = jnp.log(jnp.array([[0.2, 0.3, 0.4]]))
  logp = old + jnp.log(jnp.asarray(ratios))

  def loss(lp):
    return f.cispo(lp, old, jnp.array([adv]), jnp.ones((1, 3)), 0.2,
                   0.28)[0].sum()

  weight = np.clip(ratios, 0.8, 1.28)
  np.testing.assert_allclose(loss(logp), -(weight * adv * np.asarray(logp))
                             .sum(), rtol=1e-6)
  # The gradient is -w A on every token, clipped ones included (PPO's is 0
  # where its clip binds).
  np.testing.assert_allclose(jax.grad(loss)(logp), -weight * adv, rtol=1e-6)
  assert f.cispo(logp, old, jnp.array([adv]), jnp.ones((1, 3)), 0.2,
                 0.28)[1].tolist() == [[True, False, True]]
  # On-policy (ratio 1) its gradient equals PPO's: -A d(log pi).
  ppo = lambda lp: f.ppo_clip(lp, jax.lax.stop_gradient(lp), jnp.array([adv]),
                              jnp.ones((1, 3)), 0.2, 0.28)[0].sum()
  cispo = lambda lp: f.cispo(lp, jax.lax.stop_gradient(lp), jnp.array([adv]),
                             jnp.ones((1, 3)), 0.2, 0.28)[0].sum()
  np.testing.assert_allclose(jax.grad(cispo)(old), jax.grad(ppo)(old),
                             rtol=1e-6)


def test_truncated_importance_weights_and_the_mismatch_metric():
  # TIS (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
  # Off-Policy RL Training"): w = min(pi_old / pi_rollout, C) per token.
  trainer = np.log([[0.5, 0.2, 0.9, 0.3]])
  rollout = np.log([[0.25, 0.4, 0.3, 0.3]])
  mask = np.array([[1.0, 1.0, 1.0, 0.0]])
  np.testing.assert_allclose(f.tis_weights(trainer, rollout, mask, 2.0),
                             [[2.0, 0.5, 2.0, 0.0]], rtol=1e-6)  # 3 -> cap
  # KL(pi_rollout || pi_old) by k3 over the 3 sampled tokens.
  d = (trainer - rollout)[0, :3]
  got = f.mismatch(trainer, rollout, mask)
  np.testing.assert_allclose(got['mismatch/kl'],
                             (np.exp(d) - d - 1).mean(), rtol=1e-5)
  np.testing.assert_allclose(
      [got['mismatch/ratio_p05'], got['mismatch/ratio_p50'],
       got['mismatch/ratio_p95']], np.quantile(np.exp(d), [0.05, 0.5, 0.95]),
      rtol=1e-5)
  same = f.mismatch(trainer, trainer, mask)
  assert float(same['mismatch/kl']) == 0.0
  assert float(same['mismatch/ratio_p05']) == float(
      same['mismatch/ratio_p95']) == 1.0


def test_mis_weights_by_hand():
  # Sequence ratios: 2 x 0.5 x 3 = 3 (above 2.5: masked whole), and
  # 1.5 x 0.8 = 1.2 (kept: every live token weighted by 1.2); the padding
  # token's ratio (10) does not count.
  trainer = np.log([[0.5, 0.2, 0.9, 0.3], [0.3, 0.4, 0.5, 0.5]])
  rollout = np.log([[0.25, 0.4, 0.3, 0.3], [0.2, 0.5, 0.05, 0.5]])
  mask = np.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
  np.testing.assert_allclose(f.mis_weights(trainer, rollout, mask, 2.5),
                             [[0, 0, 0, 0], [1.2, 1.2, 0, 0]], rtol=1e-6)
  np.testing.assert_allclose(f.mis_weights(trainer, rollout, mask, 3.5),
                             [[3, 3, 3, 0], [1.2, 1.2, 0, 0]], rtol=1e-6)
  # Per token within [0.7, 1.6]: only 1.5 and 0.8 stay; clipped (TIS):
  # 2 -> 1.6, 0.5 -> 0.7, 3 -> 1.6, 1.5 and 0.8 stay.
  np.testing.assert_allclose(
      f.mis_weights(trainer, rollout, mask, 1.6, 0.7, 'token'),
      [[0, 0, 0, 0], [1.5, 0.8, 0, 0]], rtol=1e-6)
  np.testing.assert_allclose(
      f.tis_weights(trainer, rollout, mask, 1.6, 0.7, 'token'),
      [[1.6, 0.7, 1.6, 0], [1.5, 0.8, 0, 0]], rtol=1e-6)


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
  # The gradient: each token's own log-probability, scaled by its
  # sequence's (stopped) ratio, -s_i A_i, and nothing from the other tokens
  # (a fully stopped ratio would give 0; an unstopped one, a sum over all).
  grad = jax.grad(lambda lp: (f.gspo_token(lp, old, adv * jnp.array(
      [1.0, -2.0]), mask, eps_low=0.9, eps_high=0.9)[0] * mask).sum())(logp)
  np.testing.assert_allclose(
      grad, -(s * np.array([1.0, -2.0]))[:, None] * np.asarray(mask),
      rtol=1e-5)


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
  assert registry.names('advantage') == [
      'drgrpo', 'gae', 'grpo', 'on_policy_distill', 'reinforce++',
      'reinforce++-baseline', 'rloo']


def test_gae_over_the_completion_tokens():
  # GAE (Schulman et al. 2016, arXiv 1506.02438), eq. 16, by hand with
  # gamma 0.9, lambda 0.8 over completion tokens 1..3 (0: prompt, 4: pad):
  # d3 = 1 - .7 = .3; d2 = .9 * .7 - .6 = .03; d1 = .9 * .6 - .5 = .04;
  # A3 = .3, A2 = .03 + .72 * .3 = .246, A1 = .04 + .72 * .246 = .21712.
  rewards = jnp.array([[0.0, 0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0, 0.0]])
  values = jnp.array([[9.0, 0.5, 0.6, 0.7, 9.0], [9.0, 1.5, 9.0, 9.0, 9.0]])
  mask = jnp.array([[0.0, 1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0]])
  adv, returns = f.gae(rewards, values, mask, 0.9, 0.8)
  np.testing.assert_allclose(adv, [[0, 0.21712, 0.246, 0.3, 0],
                                   [0, 0.5, 0, 0, 0]], atol=1e-6)
  np.testing.assert_allclose(returns, [[0, 0.71712, 0.846, 1.0, 0],
                                       [0, 2.0, 0, 0, 0]], atol=1e-6)
  # gamma = lambda = 1: every token's return is the episode's reward.
  _, returns = f.gae(rewards, values, mask, 1.0, 1.0)
  np.testing.assert_allclose(returns * mask, mask * jnp.array([[1.0], [2.0]]),
                             atol=1e-6)


def test_clipped_value_loss_and_whitening():
  # PPO's value clipping (as in OpenAI baselines ppo2): 0.5 max((V - R)^2,
  # (V_old + clip(V - V_old, -c, c) - R)^2). Token 0: max(1, .49) = 1;
  # token 1: max(1, (.7 - 3)^2 = 5.29), the clipped term.
  loss, clipped = f.value_loss(jnp.array([1.0, 2.0]), jnp.array([0.5, 0.5]),
                               jnp.array([0.0, 3.0]), 0.2)
  np.testing.assert_allclose(loss, [0.5, 2.645], rtol=1e-6)
  assert clipped.tolist() == [False, True]
  unclipped, _ = f.value_loss(jnp.array([1.0, 2.0]), jnp.array([0.5, 0.5]),
                              jnp.array([0.0, 3.0]), 0.0)
  np.testing.assert_allclose(unclipped, [0.5, 0.5], rtol=1e-6)
  # Whitening over the masked entries only: mean 2, variance 2/3.
  white = f.whiten(jnp.array([1.0, 2.0, 3.0, 100.0]),
                   jnp.array([1.0, 1.0, 1.0, 0.0]))
  np.testing.assert_allclose(white, [-np.sqrt(1.5), 0, np.sqrt(1.5), 0],
                             rtol=1e-5)


# A 2 x 4 example: token ratios pi_old / pi_rollout of the live tokens
# 2, 0.5, 3 (row 0) and 1.5, 0.8 (row 1); the padding's do not count.
TRAINER = np.log([[0.5, 0.2, 0.9, 0.3], [0.3, 0.4, 0.5, 0.5]])
ROLLOUT = np.log([[0.25, 0.4, 0.3, 0.3], [0.2, 0.5, 0.05, 0.5]])
MASK = np.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
GEO = [3 ** (1 / 3), 1.2 ** 0.5]  # the rows' geometric means


@pytest.mark.parametrize('level, ratios', [
    ('token', [[2, 0.5, 3, 0], [1.5, 0.8, 0, 0]]),
    ('sequence', [[3, 3, 3, 0], [1.2, 1.2, 0, 0]]),
    ('geometric', [[GEO[0]] * 3 + [0], [GEO[1]] * 2 + [0, 0]]),
])
def test_importance_weights_at_each_level_with_both_thresholds(level,
                                                               ratios):
  ratios = np.array(ratios)
  live = MASK > 0
  got = np.asarray(f.is_ratios(TRAINER, ROLLOUT, MASK, level)) * MASK
  np.testing.assert_allclose(got, ratios, rtol=1e-6)
  low, high = 0.7, 1.6
  np.testing.assert_allclose(
      f.tis_weights(TRAINER, ROLLOUT, MASK, high, low, level),
      np.where(live, np.clip(ratios, low, high), 0), rtol=1e-6)
  np.testing.assert_allclose(
      f.mis_weights(TRAINER, ROLLOUT, MASK, high, low, level),
      np.where(live & (ratios >= low) & (ratios <= high), ratios, 0),
      rtol=1e-6)
