"""Pipeline parallelism: a `stage` mesh axis splits the stacked layers
(`--config.sharding.layers`), and a pass without a cache runs them as a
pipeline of micro-batches. Log-probabilities, entropies and their
gradients equal the unsplit model's on packed rows; a device holds its
stage's layers only."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models import test_sequence_parallel as sp
from tunix_pw.configs import common
from tunix_pw.models import checkpoints, decoder

# tiny-gemma2, 8 layers: 4 repeats of (local, global).
CFG = dataclasses.replace(sp.CFG, num_layers=8,
                          layer_types=sp.CFG.layer_types * 2)


def packed_rows(n: int, t: int):
  """Two documents a row, cut where the row's index says: each
  micro-batch has masks and positions of its own."""
  tokens, _, _ = sp.packed_rows(n, t)
  cuts = np.arange(n)[:, None] + 3
  at = np.arange(t)[None]
  positions = np.where(at < cuts, at, at - cuts)
  return tokens, jnp.asarray(positions, jnp.int32), jnp.asarray(
      1 + (at >= cuts), jnp.int32)


def mesh(stages: int, tp: int = 1):
  return jax.sharding.Mesh(
      np.array(jax.devices()[:8]).reshape(stages, 8 // (stages * tp), tp),
      ('stage', 'fsdp', 'tp'))


@pytest.mark.parametrize('stages, tp, adapters',
                         [(2, 1, False), (4, 1, True), (2, 2, False)])
def test_stages_give_the_unsplit_values_and_gradients(stages, tp, adapters):
  """4 repeats in 2 or 4 stages, 4 micro-batches of 2 rows; with LoRA
  adapters in the second, tensor parallelism inside each stage in the
  third."""
  sp.assert_unchanged_by(mesh(stages, tp), packed_rows(8, 32), adapters,
                         CFG)


def test_a_stage_holds_its_layers_and_the_bubble():
  model = checkpoints.init(CFG, seed=0, mesh=mesh(4),
                           rules=common.sharding())
  q = model.groups[0][0].attn.q[...]  # [repeats, D, N, H]
  assert q.sharding.shard_shape(q.shape)[0] == 1
  assert decoder.bubble(4, 4) == 3 / 7
