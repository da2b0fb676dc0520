"""Distillation divergences equal hand computations of the published
formulas, over the vocabulary and over the teacher's top-k."""

import jax
import jax.numpy as jnp
import numpy as np

from tunix_pw.train import distill_losses

STUDENT = np.array([[1.0, 0.0, -1.0, 2.0]])
TEACHER = np.array([[0.5, 1.5, -2.0, 0.0]])


def softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def kl(p, q):
  return (p * np.log(p / q)).sum(-1)


def divergences(tau, indices=None):
  log_s, log_t = distill_losses.log_probs(
      jnp.asarray(STUDENT), jnp.asarray(
          TEACHER if indices is None else np.take_along_axis(
              TEACHER, indices, -1)),
      None if indices is None else jnp.asarray(indices), tau)
  return {name: float(fn(log_s, log_t, 0.3)[0]) for name, fn in (
      ('forward', distill_losses.forward_kl),
      ('reverse', distill_losses.reverse_kl),
      ('jsd', distill_losses.jsd))}


def test_the_three_divergences_at_a_temperature():
  # Hinton et al. 2015: softmax(z / tau); forward KL(p_T || p_S).
  # MiniLLM (Gu et al. 2024): reverse KL(p_S || p_T).
  # GKD (Agarwal et al. 2024, eq. 2): beta KL(p_T || m) + (1 - beta)
  # KL(p_S || m), m = beta p_T + (1 - beta) p_S.
  tau, beta = 2.0, 0.3
  s, t = softmax(STUDENT / tau)[0], softmax(TEACHER / tau)[0]
  m = beta * t + (1 - beta) * s
  got = divergences(tau)
  np.testing.assert_allclose(got['forward'], kl(t, s), rtol=1e-5)
  np.testing.assert_allclose(got['reverse'], kl(s, t), rtol=1e-5)
  np.testing.assert_allclose(got['jsd'],
                             beta * kl(t, m) + (1 - beta) * kl(s, m),
                             rtol=1e-5)


def test_top_k_renormalises_both_over_the_teachers_tokens():
  values, indices = distill_losses.top_k(jnp.asarray(TEACHER), 2)
  np.testing.assert_array_equal(indices, [[1, 0]])
  np.testing.assert_allclose(values, [[1.5, 0.5]])
  s = softmax(STUDENT[:, [1, 0]])[0]
  t = softmax(TEACHER[:, [1, 0]])[0]
  got = divergences(1.0, np.asarray(indices))
  np.testing.assert_allclose(got['forward'], kl(t, s), rtol=1e-5)
  np.testing.assert_allclose(got['reverse'], kl(s, t), rtol=1e-5)


def test_identical_distributions_diverge_by_zero():
  log = jax.nn.log_softmax(jnp.asarray(TEACHER))
  for fn in (distill_losses.forward_kl, distill_losses.reverse_kl,
             distill_losses.jsd):
    np.testing.assert_allclose(fn(log, log, 0.5), [0.0], atol=1e-7)


def test_attention_transfer_by_hand_and_with_unequal_heads():
  # Zagoruyko & Komodakis 2017 on attention probabilities: per real query,
  # the squared difference summed over keys, averaged over heads.
  rng = np.random.default_rng(0)
  student = softmax(rng.normal(size=(1, 2, 3, 3)))
  teacher = softmax(rng.normal(size=(1, 2, 3, 3)))
  real = np.array([[1.0, 1.0, 0.0]])
  per_query = ((student - teacher) ** 2).sum(-1).mean(1)[0]
  np.testing.assert_allclose(
      distill_losses.attention_transfer(student, teacher, real),
      per_query[:2].mean(), rtol=1e-6)
  # Four teacher heads against two: both sides' heads averaged first.
  teacher4 = softmax(rng.normal(size=(1, 4, 3, 3)))
  diff = (student.mean(1) - teacher4.mean(1)) ** 2
  np.testing.assert_allclose(
      distill_losses.attention_transfer(student, teacher4, real),
      diff.sum(-1)[0, :2].mean(), rtol=1e-6)


def test_feature_loss_per_token_and_mean_pooled():
  # FitNets (Romero et al. 2015): squared error of (projected) features.
  s = np.array([[[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]]])
  t = np.array([[[0.0, 2.0], [3.0, 2.0], [0.0, 0.0]]])
  real = np.array([[1.0, 1.0, 0.0]])  # the last position is padding
  np.testing.assert_allclose(
      distill_losses.feature(s, t, real, pooling='token'),
      np.mean([(1 + 0) / 2, (0 + 4) / 2]), rtol=1e-6)
  pooled_s, pooled_t = np.array([2.0, 3.0]), np.array([1.5, 2.0])
  np.testing.assert_allclose(
      distill_losses.feature(s, t, real, pooling='mean'),
      ((pooled_s - pooled_t) ** 2).mean(), rtol=1e-6)
