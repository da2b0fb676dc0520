"""The frozen scoring role: a model from any model block, on its mesh,
that runs forward passes only."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from tunix_pw.configs import common
from tunix_pw.models import checkpoints, hf, presets
from tunix_pw.runtime import meshes
from tunix_pw.train import scoring


def test_a_scorer_from_a_checkpoint_on_its_own_mesh(tmp_path):
  cfg = presets.PRESETS['tiny-llama3']
  model = checkpoints.init(cfg, seed=5)
  hf.save(str(tmp_path), cfg, nnx.state(model))
  role_meshes = meshes.build(common.meshes(
      'disaggregated', actor=('fsdp=4', '0:4'), reward=('fsdp=2,tp=2', '4:8')),
      jax.devices())
  block = common.model('tiny-llama3', checkpoint=str(tmp_path))
  scorer = scoring.from_block(block, role_meshes['reward'], common.sharding(),
                              seed=0)
  assert scorer.mesh is role_meshes['reward']
  assert {d.id for leaf in jax.tree.leaves(scorer.state)
          for d in leaf.sharding.device_set} == {4, 5, 6, 7}
  tokens = jnp.array([[5, 9, 11, 3, 7]])
  args = (tokens, jnp.arange(5)[None], jnp.ones_like(tokens))
  np.testing.assert_allclose(
      nnx.merge(scorer.graphdef, scorer.state)(*args)[0], model(*args)[0],
      atol=1e-5, rtol=0)
