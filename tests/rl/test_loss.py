"""The policy loss's on-policy distillation term: at every sampled position,
weight x tau^2 x KL(p_T || p_S) of the whole next-token distributions at
temperature tau (GKD, Agarwal et al. 2024, arXiv 2306.13649, with the
forward KL of Hinton et al. 2015), by hand."""

import jax.numpy as jnp
import ml_collections
import numpy as np

from tunix_pw.models import checkpoints, presets
from tunix_pw.rl import loss

RL = ml_collections.ConfigDict(dict(
    policy_loss='ppo_clip', eps_low=0.2, eps_high=0.2,
    aggregation='token-mean', kl='k3', kl_beta=0.0, max_new_tokens=4,
    temperature=1.0))


def softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_the_teachers_logits_add_the_weighted_divergence_where_sampled():
  cfg = presets.PRESETS['tiny-gemma']
  model = checkpoints.init(cfg, seed=0)
  rng = np.random.default_rng(0)
  n, t = 2, 6
  tokens = rng.integers(3, cfg.vocab_size, (n, t)).astype(np.int32)
  loss_mask = np.array([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]], np.int32)
  batch = dict(tokens=tokens, positions=np.tile(np.arange(t), (n, 1)),
               segment_ids=np.ones((n, t), np.int32), loss_mask=loss_mask,
               weights=np.ones(n, np.float32),
               advantages=np.zeros((n, t - 1), np.float32))
  teacher = rng.normal(size=(n, t, cfg.vocab_size)).astype(np.float32)
  d = ml_collections.ConfigDict(dict(divergence='forward_kl', beta=0.5,
                                     temperature=2.0, top_k=0, weight=0.5))

  plain, _ = loss.rl_loss(model, batch, None, rl=RL)
  total, metrics = loss.rl_loss(model, dict(batch, teacher_logits=teacher),
                                None, rl=RL, distill=d)

  student = np.asarray(model(jnp.asarray(tokens), batch['positions'],
                             batch['segment_ids'])[0], np.float64)
  p_t, p_s = (softmax(x[:, :-1] / 2.0) for x in (teacher, student))
  kd = 4.0 * (p_t * np.log(p_t / p_s)).sum(-1)
  mask = loss_mask[:, 1:]
  # token-mean: the step divides the sum by the weight, the mask's count.
  np.testing.assert_allclose(float(total - plain),
                             0.5 * (kd * mask).sum(), rtol=1e-4)
  np.testing.assert_allclose(float(metrics['weight']), mask.sum())
  np.testing.assert_allclose(float(metrics['distill']) / mask.sum(),
                             (kd * mask).sum() / mask.sum(), rtol=1e-4)
