"""The policy loss's on-policy distillation term: at every sampled position,
weight x tau^2 x KL(p_T || p_S) of the whole next-token distributions at
temperature tau (GKD, Agarwal et al. 2024, arXiv 2306.13649, with the
forward KL of Hinton et al. 2015), by hand."""

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tunix_pw.configs import grpo as grpo_config
from tunix_pw.models import checkpoints, presets
from tunix_pw.rl import loss, plan
from tunix_pw.train import distill_losses

RL = ml_collections.ConfigDict(dict(
    policy_loss='ppo_clip', eps_low=0.2, eps_high=0.2,
    aggregation='token-mean', kl='k3', kl_beta=0.0, max_new_tokens=4,
    temperature=1.0, logits_chunk=0))


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


def big_vocabulary_model():
  """tiny-gemma3 with Gemma 3's 262,144-entry vocabulary (and its final
  soft-cap), narrow enough for a CPU."""
  cfg = presets.PRESETS['tiny-gemma3'].replace(
      vocab_size=262_144, embed_dim=32, head_dim=8, mlp_dim=64)
  return checkpoints.init(cfg, seed=0)


def test_chunked_logits_give_the_same_logps_entropy_and_gradients():
  """In float32, within 1e-6 relative: chunks of 3 positions (the last one
  padded) against all 10 at once, at a temperature, values and the
  gradients of a loss that weighs both."""
  model = big_vocabulary_model()
  rng = np.random.default_rng(1)
  n, t = 2, 10
  tokens = jnp.asarray(rng.integers(0, 262_144, (n, t)), jnp.int32)
  positions = jnp.tile(jnp.arange(t), (n, 1))
  segments = jnp.ones((n, t), jnp.int32)
  w = jnp.asarray(rng.normal(size=(n, t - 1)), jnp.float32)
  graphdef, state = nnx.split(model)

  def objective(state, chunk):
    logp, entropy = loss.token_logps(nnx.merge(graphdef, state), tokens,
                                     positions, segments, temperature=0.7,
                                     chunk=chunk)
    return (logp * w).sum() + (entropy * w[::-1]).sum(), (logp, entropy)

  (whole, (logp, ent)), grads = jax.value_and_grad(
      objective, has_aux=True)(state, t)
  (chunked, (logp3, ent3)), grads3 = jax.value_and_grad(
      objective, has_aux=True)(state, 3)
  np.testing.assert_allclose(logp3, logp, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(ent3, ent, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(chunked, whole, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(grads3), jax.tree.leaves(grads)):
    scale = float(jnp.abs(b).max())
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6 * scale)


def test_chunks_hold_a_fraction_of_the_whole_logits():
  """The log-probability pass of 4 x 2,048 tokens over 262,144 entries
  compiles with its temporaries under a tenth of the 8 GiB the whole
  float32 logits would take (nothing runs)."""
  model = big_vocabulary_model()
  graphdef, state = nnx.split(model)
  shape = jax.ShapeDtypeStruct((4, 2048), jnp.int32)

  def temp_bytes(chunk):
    program = jax.jit(lambda s, x: loss.token_logps(
        nnx.merge(graphdef, s), x, x, x, chunk=chunk)[0])
    return program.lower(state, shape).compile().memory_analysis(
        ).temp_size_in_bytes

  whole_logits = 4 * 2048 * 262_144 * 4
  assert temp_bytes(2048) >= whole_logits
  assert temp_bytes(0) < whole_logits / 10  # the default chunk: 128


def on_policy_batch(n, t, vocab, top_k, rng):
  """A GRPO batch of random tokens and the outputs of a random teacher."""
  return dict(
      tokens=jnp.asarray(rng.integers(0, vocab, (n, t)), jnp.int32),
      positions=jnp.tile(jnp.arange(t), (n, 1)),
      segment_ids=jnp.ones((n, t), jnp.int32),
      loss_mask=jnp.asarray(rng.integers(0, 2, (n, t)), jnp.int32),
      weights=jnp.ones(n, jnp.float32),
      advantages=jnp.asarray(rng.normal(size=(n, t - 1)), jnp.float32),
      **distill_losses.teacher_outputs(
          jnp.asarray(rng.normal(size=(n, t, vocab)), jnp.float32), top_k))


@pytest.mark.parametrize('top_k', [0, 8])
def test_on_policy_distillation_by_chunks_equals_the_whole_logits(top_k):
  """On-policy distillation on a 262,144-entry vocabulary, the logits 3
  positions at a time (the last chunk padded) against all 10 at once, the
  teacher's whole or top-k: the teacher's outputs, and the policy loss
  with the whole distributions' term, its metrics and its gradients,
  within 1e-6 relative (float32)."""
  config = grpo_config.get_config('runlocal,distill')
  config.distill.update(top_k=top_k, temperature=2.0, weight=0.5)
  model = big_vocabulary_model()
  graphdef, state = nnx.split(model)
  n, t = 2, 10
  batch = on_policy_batch(n, t, model.cfg.vocab_size, top_k,
                          np.random.default_rng(4))

  def teacher(chunk):
    config.rl.logits_chunk = chunk
    return plan.make_teacher(config, None, graphdef)(state, batch)

  whole, chunked = teacher(t), teacher(3)
  assert set(whole) == {'ref_logps', *distill_losses.teacher_outputs(
      whole['teacher_logits'], top_k)}
  for key in whole:
    np.testing.assert_allclose(chunked[key], whole[key], rtol=1e-6, atol=1e-6)

  def objective(state, chunk):
    rl = dict(RL, logits_chunk=chunk)
    return loss.rl_loss(nnx.merge(graphdef, state), batch, None,
                        rl=ml_collections.ConfigDict(rl),
                        distill=config.distill)

  sums = assert_chunks_change_nothing(objective, state, t)
  assert sums['distill'] > 0


def assert_chunks_change_nothing(objective, state, t):
  """objective(state, chunk) -> (loss, sums): the loss, its sums and its
  gradients at chunks of 3 positions equal those at all t at once, within
  1e-6 relative (float32). Returns the sums."""
  grad = jax.value_and_grad(objective, has_aux=True)
  (whole, sums), grads = grad(state, t)
  (chunked, sums3), grads3 = grad(state, 3)
  np.testing.assert_allclose(chunked, whole, rtol=1e-6)
  for key in sums:
    np.testing.assert_allclose(sums3[key], sums[key], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(grads3), jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b, rtol=1e-6,
                               atol=1e-6 * float(jnp.abs(b).max()))
  return sums3


def test_on_policy_distillation_by_chunks_holds_a_fraction_of_the_logits():
  """The gradient of the policy loss with the whole distributions' term
  (the teacher's top 8), 4 x 2,048 tokens over 262,144 entries, compiles
  with temporaries smaller than the unchunked one's by more than the
  student's whole float32 logits, 8 GiB (measured: 5.7 against 20.7 GiB;
  most of the 5.7 is the attention's activations); the teacher's pass
  holds under a quarter of them (measured: 1.0 against 8.0 GiB). Nothing
  runs."""
  config = grpo_config.get_config('runlocal,distill')
  config.distill.top_k = 8
  model = big_vocabulary_model()
  graphdef, state = nnx.split(model)
  rows = jax.ShapeDtypeStruct((4, 2048), jnp.int32)
  per_token = jax.ShapeDtypeStruct((4, 2047), jnp.float32)
  top = jax.ShapeDtypeStruct((4, 2048, 8), jnp.float32)
  batch = dict(tokens=rows, positions=rows, segment_ids=rows, loss_mask=rows,
               weights=jax.ShapeDtypeStruct((4,), jnp.float32),
               advantages=per_token, teacher_logits=top,
               teacher_indices=jax.ShapeDtypeStruct(top.shape, jnp.int32))

  def temp_bytes(chunk):
    rl = ml_collections.ConfigDict(dict(RL, logits_chunk=chunk))
    program = jax.jit(jax.grad(lambda s, b: loss.rl_loss(
        nnx.merge(graphdef, s), b, None, rl=rl, distill=config.distill)[0]))
    return program.lower(state, batch).compile().memory_analysis(
        ).temp_size_in_bytes

  logits = 4 * 2048 * 262_144 * 4
  assert temp_bytes(2048) - temp_bytes(0) > logits  # the default chunk: 128
  config.rl.logits_chunk = 0
  teacher = plan.make_teacher(config, None, graphdef).lower(state, batch)
  assert teacher.compile().memory_analysis().temp_size_in_bytes < logits / 4
