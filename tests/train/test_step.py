"""The train step: gradient accumulation equals the full batch; preference
losses (DPO, IPO, ORPO, KTO) equal hand computations of the published
formulas; KTO's batches."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from tunix_pw.data import formats, pipeline
from tunix_pw.train.supervised import sft_loss
from tunix_pw.models import checkpoints, presets
from tunix_pw.train import losses, step as step_lib
from tests.rl import test_loss


def batch_with_unequal_tokens():
  """8 rows whose target counts differ, so micro batches of 2 rows carry
  unequal token counts."""
  rng = np.random.default_rng(0)
  rows = []
  for n, answer in zip(range(6, 14), range(1, 9)):
    tokens = rng.integers(4, 120, n)
    mask = np.r_[np.zeros(n - answer), np.ones(answer)]
    rows.append(dict(tokens=tokens, loss_mask=mask))
  return pipeline.pad_batch(rows, 16, 0)


def one_update(micro_batches: int):
  model = checkpoints.init(presets.PRESETS['tiny-gemma2'], seed=0)
  graphdef, params = nnx.split(model)
  optimizer = optax.sgd(0.5)
  state = step_lib.TrainState.create(params, optimizer, 0)
  step = step_lib.make_step(graphdef, None, sft_loss, optimizer,
                            lambda s: 0.5, micro_batches)
  state, metrics = step(state, jax.tree.map(jnp.asarray,
                                            batch_with_unequal_tokens()))
  return state.params, metrics


def test_accumulation_over_4_micro_batches_equals_one_batch():
  batch = batch_with_unequal_tokens()
  per_micro = [int(batch['loss_mask'][m::4, 1:].sum()) for m in range(4)]
  assert len(set(per_micro)) > 1  # really unequal
  full, full_metrics = one_update(1)
  accumulated, accumulated_metrics = one_update(4)
  np.testing.assert_allclose(full_metrics['loss'],
                             accumulated_metrics['loss'], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(accumulated)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
  assert float(full_metrics['weight']) == sum(per_micro)


def test_dpo_and_ipo_equal_hand_computation():
  # DPO (Rafailov et al. 2023, eq. 7): -log sigmoid(beta * margin);
  # IPO (Azar et al. 2023, eq. 17): (margin - 1 / (2 beta))^2.
  pc, pr = jnp.array([-3.0, -5.0]), jnp.array([-4.0, -2.0])
  rc, rr = jnp.array([-3.5, -4.0]), jnp.array([-3.5, -3.0])
  beta, n = 0.5, jnp.ones(2)  # lengths: unused by DPO and IPO
  margins = np.array([(-3 + 4) - (-3.5 + 3.5), (-5 + 2) - (-4 + 3)])
  np.testing.assert_allclose(
      losses.dpo(losses.Pair(pc, n, pr, n, rc, rr), beta, 0.0),
      np.log1p(np.exp(-beta * margins)), rtol=1e-6)
  np.testing.assert_allclose(
      losses.ipo(losses.Pair(pc, n, pr, n, rc, rr), beta, 0.0),
                             (margins - 1 / (2 * beta)) ** 2, rtol=1e-6)


def test_orpo_equals_hand_computation():
  # ORPO (Hong et al. 2024, eq. 6-7): L_SFT + lambda * L_OR, with
  # odds(p) = p / (1 - p) of the mean per-token likelihood.
  chosen_sum, chosen_n = jnp.array([-2.0]), jnp.array([4.0])
  rejected_sum, rejected_n = jnp.array([-6.0]), jnp.array([3.0])
  lam = 0.2
  pc, pr = np.exp(-0.5), np.exp(-2.0)
  odds = lambda p: p / (1 - p)
  expected = 0.5 + lam * -np.log(1 / (1 + odds(pr) / odds(pc)))
  np.testing.assert_allclose(
      losses.orpo(losses.Pair(chosen_sum, chosen_n, rejected_sum,
                              rejected_n), 0.0, lam),
      [expected], rtol=1e-6)


def test_kto_equals_hand_computation():
  # KTO (Ethayarajh et al. 2024, eq. 8): r = log pi/ref; z0 = max(0, mean
  # r of mismatched completions), no gradient; desirable: lambda_D (1 -
  # sigmoid(beta (r - z0))), undesirable: lambda_U (1 - sigmoid(beta (z0 -
  # r))).
  logps, ref = jnp.array([-2.0, -6.0, -3.0]), jnp.array([-3.0, -5.0, -3.5])
  mismatched = jnp.array([-9.0, -7.0, -8.0])
  ref_mismatched = jnp.array([-10.0, -7.5, -8.0])  # mean r: 0.5
  desirable = jnp.array([1.0, 0.0, 0.0])
  beta, lam_d, lam_u = 0.5, 1.0, 1.5
  sigmoid = lambda x: 1 / (1 + np.exp(-x))
  r, z0 = np.array([1.0, -1.0, 0.5]), 0.5
  expected = [lam_d * (1 - sigmoid(beta * (r[0] - z0))),
              lam_u * (1 - sigmoid(beta * (z0 - r[1]))),
              lam_u * (1 - sigmoid(beta * (z0 - r[2])))]
  batch = losses.Unpaired(logps, ref, mismatched, ref_mismatched, desirable)
  np.testing.assert_allclose(losses.kto(batch, beta, lam_d, lam_u), expected,
                             rtol=1e-6)
  # The reference point is floored at 0 and carries no gradient.
  below = batch._replace(ref_mismatched=mismatched + 1.0)
  assert float(losses.kto_reference_point(below)) == 0.0
  grad = jax.grad(lambda m: losses.kto_reference_point(
      batch._replace(mismatched=m)))(mismatched)
  np.testing.assert_array_equal(grad, np.zeros(3))


def test_kto_batch_splits_pairs_and_mismatches_completions():
  """Each pair gives a desirable and an undesirable example (chosen sides
  first); each example's mismatched sequence is its prompt and the next
  example's completion."""
  def side(prompt, completion):
    return (np.array(prompt + completion, np.int32),
            np.array([0] * len(prompt) + [1] * len(completion), np.int32))

  rows = []
  for prompt, chosen, rejected in (([1, 2], [3], [4, 5]), ([6], [7, 8], [9])):
    row = {}
    for name, completion in (('chosen', chosen), ('rejected', rejected)):
      row[f'{name}_tokens'], row[f'{name}_loss_mask'] = side(prompt,
                                                            completion)
    rows.append(row)
  batch = formats.kto_batch(rows, length=6, pad_id=0)
  np.testing.assert_array_equal(batch['desirable'], [1, 1, 0, 0])
  np.testing.assert_array_equal(batch['completion_tokens'], [
      [1, 2, 3, 0, 0, 0], [6, 7, 8, 0, 0, 0],
      [1, 2, 4, 5, 0, 0], [6, 9, 0, 0, 0, 0]])
  # Prompts: 1 2 | 6 | 1 2 | 6; completions of the next example.
  np.testing.assert_array_equal(batch['mismatched_tokens'], [
      [1, 2, 7, 8, 0, 0], [6, 4, 5, 0, 0, 0],
      [1, 2, 9, 0, 0, 0], [6, 3, 0, 0, 0, 0]])
  np.testing.assert_array_equal(batch['mismatched_loss_mask'], [
      [0, 0, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0],
      [0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0]])
  np.testing.assert_array_equal(batch['mismatched_segment_ids'] > 0,
                                batch['mismatched_tokens'] > 0)


def test_a_non_finite_step_is_skipped_and_counted():
  """A NaN loss leaves parameters and optimizer state as they were, counts
  the streak, and the next finite step updates and resets it."""
  import optax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  class Linear(nnx.Module):

    def __init__(self):
      self.w = nnx.Param(jnp.ones((3,)))

  graphdef, params = nnx.split(Linear())

  def loss_fn(model, batch, rng):
    del rng
    loss = (model.w.get_value() * batch['x']).sum() * batch['scale'].sum()
    return loss, dict(weight=jnp.float32(1.0))

  optimizer = optax.sgd(0.1)
  step = step_lib.make_step(graphdef, None, loss_fn, optimizer,
                            lambda s: 0.1, 1)
  state = step_lib.TrainState.create(params, optimizer, seed=0)
  x = jnp.ones((1, 3))
  for scale, skipped, streak in ((jnp.nan, 1, 1), (jnp.inf, 1, 2),
                                 (1.0, 0, 0)):
    before = np.asarray(state.params['w'].get_value())
    state, m = step(state, dict(x=x, scale=jnp.full((1,), scale)))
    after = np.asarray(state.params['w'].get_value())
    assert (float(m['skipped']), float(m['nonfinite_streak'])) == (skipped,
                                                                  streak)
    assert np.array_equal(after, before) == bool(skipped)
    assert np.isfinite(after).all()
  np.testing.assert_allclose(after, before - 0.1)


def test_on_cpu_the_train_step_unrolls_the_layers():
  """By default (model.unroll_cpu_train) a train step on CPU devices runs
  the layers unscanned: its program loops over no layers, and one SGD step
  on the fsdp=4 x tp=2 mesh gives the scanned step's loss and parameters
  to float rounding."""
  from tunix_pw.configs import sft as sft_config  # pylint: disable=g-import-not-at-top
  from tunix_pw.train import supervised  # pylint: disable=g-import-not-at-top
  from tunix_pw.runtime import meshes  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  tokens = rng.integers(4, 100, (64, 16))
  batch = dict(tokens=tokens, positions=np.broadcast_to(np.arange(16),
                                                         tokens.shape),
               segment_ids=np.ones_like(tokens),
               loss_mask=np.ones(tokens.shape, np.float32))
  loops, losses, params = [], [], []
  for unroll in (True, False):
    config = sft_config.get_config('runlocal')
    config.model.unroll_cpu_train = unroll
    config.optimizer.update(name='sgd', learning_rate=1.0, warmup_steps=0,
                            clip_norm=0.0, schedule='constant')
    policy = supervised.plan(config, meshes.build(config.meshes, jax.devices()),
                      abstract=False)
    step = policy.train_step
    loops.append(step.func.lower(policy.state, batch, **step.keywords)
                 .as_text().count('stablehlo.while'))
    state, metrics = step(policy.state, batch)
    losses.append(float(metrics['loss']))
    params.append(jax.device_get(state.params))
  # Scanned: two loops more, over the layers forward and backward.
  assert loops[1] - loops[0] == 2
  np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
  for unrolled, scanned in zip(*map(jax.tree.leaves, params)):
    # Moved by about 1e-2; equal to a few of their ulps.
    np.testing.assert_allclose(unrolled, scanned, rtol=1e-6, atol=1e-7)


def test_chunked_token_nll_equals_the_whole_logits_and_their_gradients():
  """SFT's and DPO's per-token NLL (and argmax accuracy) from logits 3
  positions at a time, against all 10 at once, on a 262,144-entry
  vocabulary: values and gradients within 1e-6 relative (float32)."""
  model = test_loss.big_vocabulary_model()
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(2)
  n, t = 2, 10
  tokens = jnp.asarray(rng.integers(0, 262_144, (n, t)), jnp.int32)
  positions = jnp.tile(jnp.arange(t), (n, 1))
  segments = jnp.asarray([[1] * t, [1] * 6 + [2] * 3 + [0]], jnp.int32)
  mask = jnp.asarray(rng.integers(0, 2, (n, t)), jnp.int32)

  def objective(state, chunk):
    nll, weight, correct = step_lib.model_token_nll(
        nnx.merge(graphdef, state), tokens, positions, segments, mask,
        chunk=chunk)
    return (nll * weight).sum(), (nll, weight, correct)

  (whole, outs), grads = jax.value_and_grad(objective, has_aux=True)(
      state, t)
  (chunked, outs3), grads3 = jax.value_and_grad(objective, has_aux=True)(
      state, 3)
  np.testing.assert_allclose(chunked, whole, rtol=1e-6)
  for a, b in zip(outs3, outs):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  for a, b in zip(jax.tree.leaves(grads3), jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b, rtol=1e-6,
                               atol=1e-6 * float(jnp.abs(b).max()))
