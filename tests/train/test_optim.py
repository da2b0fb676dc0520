"""Optimizers from config blocks: float32 state for bfloat16 parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tunix_pw.configs import common
from tunix_pw.errors import UsageError
from tunix_pw.train import optim


def test_float32_state_for_bfloat16_parameters():
  block = common.optimizer(learning_rate=1e-2, warmup_steps=0,
                           schedule='constant')
  block.state_dtype = 'float32'
  optim.check(block)
  transform, _ = optim.make(block, total_steps=10)
  rng = np.random.default_rng(0)
  params = {'w': jnp.asarray(rng.normal(size=(8, 4)), jnp.bfloat16)}
  state = transform.init(params)
  moments = [x for x in jax.tree.leaves(state) if x.ndim == 2]
  assert moments and all(x.dtype == jnp.float32 for x in moments)
  # Two updates: the second's moments hold the first's gradient in float32.
  reference, _ = optim.make(common.optimizer(
      learning_rate=1e-2, warmup_steps=0, schedule='constant'), 10)
  ref_params = {'w': params['w'].astype(jnp.float32)}
  ref_state = reference.init(ref_params)
  for _ in range(2):
    grads = {'w': jnp.asarray(rng.normal(size=(8, 4)) * 1e-3, jnp.bfloat16)}
    updates, state = transform.update(grads, state, params)
    expected, ref_state = reference.update(
        {'w': grads['w'].astype(jnp.float32)}, ref_state, ref_params)
    assert updates['w'].dtype == jnp.bfloat16
    np.testing.assert_array_equal(updates['w'],
                                  expected['w'].astype(jnp.bfloat16))
  assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()),
                                   optax.tree_utils.tree_get(state, 'mu'),
                                   optax.tree_utils.tree_get(ref_state, 'mu')))


def test_an_unknown_state_dtype_is_refused():
  block = common.optimizer()
  block.state_dtype = 'float16'
  with pytest.raises(UsageError, match='state_dtype'):
    optim.check(block)
