"""Sequence parallelism: a `sequence` mesh axis splits the tokens of every
activation (`--config.sharding.length`), keys and values gathered whole
for attention. Log-probabilities, entropies and their gradients equal
the unsplit model's on packed rows (segment ids, positions restarting);
a device holds about half the activations."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tunix_pw.configs import common
from tunix_pw.models import checkpoints, lora, presets
from tunix_pw.rl import loss
from tunix_pw.runtime.sharding import Sharder

CFG = presets.PRESETS['tiny-gemma2']  # sliding windows and soft-caps too


def mesh(ways: int = 2):
  return jax.sharding.Mesh(
      np.array(jax.devices()[:8]).reshape(8 // ways, ways),
      ('fsdp', 'sequence'))


def packed_rows(n: int, t: int):
  """Two documents a row: positions restart, segment ids change."""
  rng = np.random.default_rng(0)
  cut = t // 2 + 3
  positions = np.concatenate([np.arange(cut), np.arange(t - cut)])
  segments = np.repeat([1, 2], [cut, t - cut])
  return (jnp.asarray(rng.integers(3, CFG.vocab_size, (n, t)), jnp.int32),
          jnp.tile(jnp.asarray(positions, jnp.int32), (n, 1)),
          jnp.tile(jnp.asarray(segments, jnp.int32), (n, 1)))


def objective(graphdef, shard, tokens, positions, segments):
  weights = jnp.cos(jnp.arange(tokens.shape[1] - 1, dtype=jnp.float32))

  def f(state):
    logp, entropy = loss.token_logps(nnx.merge(graphdef, state), tokens,
                                     positions, segments, shard, chunk=8)
    return ((logp * weights).sum() + (entropy * weights[::-1]).sum(),
            (logp, entropy))
  return jax.jit(jax.value_and_grad(f, has_aux=True))


def assert_unchanged_by(where, rows, adapters: bool, cfg=CFG) -> None:
  """The objective's value, log-probabilities, entropies and gradients on
  mesh `where` equal one device's; with LoRA adapters on attention and the
  MLP when `adapters`."""
  rules = common.sharding()
  results = []
  for mesh_ in (None, where):
    model = checkpoints.init(cfg, seed=0, mesh=mesh_,
                             rules=rules if mesh_ else None)
    if adapters:
      lora.apply(model, r'.*(attn/(q|v|o)|mlp/down)', rank=4, alpha=8.0)
    graphdef, state = nnx.split(model)
    shard = Sharder(mesh_, rules) if mesh_ else Sharder()
    results.append(objective(graphdef, shard, *rows)(state))
  (value, (logp, entropy)), grads = results[0]
  (value2, (logp2, entropy2)), grads2 = results[1]
  np.testing.assert_allclose(logp2, logp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(entropy2, entropy, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(value2, value, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grads2), jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b, rtol=1e-5,
                               atol=1e-5 * float(jnp.abs(b).max()))


@pytest.mark.parametrize('ways, adapters', [(2, False), (4, True)])
def test_split_tokens_give_the_unsplit_values_and_gradients(ways, adapters):
  """2 or 4 ways; with LoRA adapters in the second."""
  assert_unchanged_by(mesh(ways), packed_rows(4, 64), adapters)


def test_a_device_holds_its_share_of_the_activations():
  """8 rows of 2,048 tokens on 8 devices: split 4 ways over `sequence`
  (and 2 over fsdp), a device holds about what a row per device holds
  (fsdp=8: the same tokens a device), queries and attention scores
  included; a quarter of what the rows alone split 2 ways hold. The
  gradient pass's temporaries (nothing runs)."""
  rows = packed_rows(8, 2048)

  def temp_bytes(shape, axes):
    where = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(shape),
                              axes)
    graphdef, state = nnx.split(checkpoints.init(
        CFG, seed=0, mesh=where, rules=common.sharding()))
    return objective(graphdef, Sharder(where, common.sharding()),
                     *rows).lower(state).compile().memory_analysis(
                     ).temp_size_in_bytes
  split = temp_bytes((2, 4), ('fsdp', 'sequence'))
  assert split < 1.4 * temp_bytes((8,), ('fsdp',))
  assert split < 0.4 * temp_bytes((2, 4), ('fsdp', 'idle'))
