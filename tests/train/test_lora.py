"""LoRA/QLoRA: the base stays bit-identical while adapters train; merged
weights give the adapter model's logits; LoRA checkpoints hold adapters
only; the merged model exports to safetensors."""

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from tests.train.test_step import batch_with_unequal_tokens
from tunix_pw.configs import common
from tunix_pw.train.supervised import sft_loss
from tunix_pw.models import checkpoints, hf, lora, presets
from tunix_pw.runtime import backend, meshes
from tunix_pw.train import program, scoring, setup
from tunix_pw.train import step as step_lib
from tunix_pw.train.checkpoint import Checkpointer

TARGETS = r'.*(attn/(q|v|o)|mlp/down)'


def trained(quantize=''):
  model = checkpoints.init(presets.PRESETS['tiny-gemma3'], seed=0)
  lora.apply(model, TARGETS, rank=4, alpha=8.0, quantize=quantize)
  graphdef, adapters, frozen = nnx.split(model, lora.LoRAParam, ...)
  before = jax.tree.map(np.asarray, frozen)
  optimizer = optax.adam(1e-2)
  state = step_lib.TrainState.create(adapters, optimizer, 0)
  step = step_lib.make_step(graphdef, frozen, sft_loss, optimizer,
                            lambda s: 1e-2, 1)
  batch = jax.tree.map(jnp.asarray, batch_with_unequal_tokens())
  for _ in range(3):
    state, _ = step(state, batch)
  return graphdef, state, frozen, before, adapters


@pytest.mark.parametrize('quantize', ['', 'int8'])
def test_base_unchanged_and_adapters_train(quantize):
  graphdef, state, frozen, before, initial = trained(quantize)
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(frozen)):
    np.testing.assert_array_equal(a, b)
  changed = [not np.array_equal(a, b) for a, b in
             zip(jax.tree.leaves(initial), jax.tree.leaves(state.params))]
  assert all(changed)
  paths = ['/'.join(map(str, p)) for p, _ in state.params.flat_state()]
  # 6 layers (one scanned block of 6) x 4 weights x (A, B)
  assert all('_lora_' in p for p in paths) and len(paths) == 6 * 4 * 2
  del graphdef
  if quantize:
    kinds = {type(v).__name__ for _, v in frozen.flat_state()}
    assert 'QuantizedBase' in kinds


def test_merged_model_gives_the_adapter_models_logits(tmp_path):
  graphdef, state, frozen, _, _ = trained()
  model = nnx.merge(graphdef, state.params, frozen)
  tokens = jnp.arange(24).reshape(2, 12) % 100
  args = (tokens, jnp.broadcast_to(jnp.arange(12), (2, 12)),
          jnp.ones_like(tokens))
  adapted, _ = model(*args)
  lora.merge(model)
  merged, _ = model(*args)
  np.testing.assert_allclose(merged, adapted, atol=1e-5, rtol=0)
  assert not any('_lora_' in '/'.join(map(str, p))
                 for p, _ in nnx.state(model).flat_state())
  hf.save(str(tmp_path / 'export'), model.cfg, nnx.state(model))
  exported, _ = checkpoints.load(str(tmp_path / 'export'))
  np.testing.assert_allclose(exported(*args)[0], adapted, atol=1e-5, rtol=0)


def test_a_merged_qlora_model_keeps_the_base_dtype():
  model = checkpoints.init(presets.PRESETS['tiny-gemma3'], seed=0,
                           param_dtype=jnp.bfloat16)
  lora.apply(model, TARGETS, rank=4, alpha=8.0, quantize='int8')
  lora.merge(model)
  dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))}
  assert dtypes == {jnp.dtype(jnp.bfloat16)}


def test_lora_checkpoints_hold_adapters_only(tmp_path):
  _, state, _, _, _ = trained()
  checkpointer = Checkpointer(str(tmp_path))
  checkpointer.save(3, state, {'grain': {}})
  checkpointer.close()
  restored, _, step, _ = Checkpointer(str(tmp_path)).restore(state)
  assert step == 3
  saved = ['/'.join(map(str, p)) for p, _ in restored.params.flat_state()]
  assert saved and all('_lora_' in p for p in saved)
  for a, b in zip(jax.tree.leaves(restored.params),
                  jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(a, b)


def test_a_lora_reference_is_the_shared_base_with_zero_adapters():
  devices = jax.devices()
  role_meshes = meshes.build(common.meshes(
      'disaggregated', actor=('fsdp=4', '0:4'), reference=('fsdp=4', '4:8')),
      devices)
  runtime = backend.Runtime(backend.LOCAL, 'test', 0, 1, tuple(devices))
  config = ml_collections.ConfigDict(dict(
      lora=common.lora(rank=0), sharding=common.sharding(),
      runtime=common.runtime()))
  model = checkpoints.init(presets.PRESETS['tiny-gemma3'], seed=0,
                           mesh=role_meshes['actor'], rules=config.sharding)
  tokens = jnp.array([[5, 9, 11, 3]])
  args = (tokens, jnp.arange(4)[None], jnp.ones_like(tokens))
  base_logits = model(*args)[0]

  # Full fine-tuning: a copy of the initial policy on the reference role.
  def policy(params, frozen):
    return program.Program(role_meshes['actor'], graphdef,
                           nnx.graphdef(model), params, frozen, None, None)

  graphdef, params, frozen = setup.split(model, use_lora=False)
  scorer = scoring.reference(config, policy(params, frozen), role_meshes,
                             runtime)
  state, mesh = scorer.state, scorer.mesh
  assert mesh is role_meshes['reference']
  for leaf in jax.tree.leaves(state):
    assert leaf.sharding.mesh is mesh
  np.testing.assert_array_equal(nnx.merge(graphdef, state)(*args)[0],
                                base_logits)

  # LoRA: the frozen base itself (no copy), adapters zero, the actor's mesh.
  lora.apply(model, TARGETS, rank=4, alpha=8.0)
  config.lora.rank = 4
  graphdef, adapters, frozen = setup.split(model, use_lora=True)
  adapters = jax.tree.map(lambda a: a + 1.0, adapters)  # trained adapters
  scorer = scoring.reference(config, policy(adapters, frozen), role_meshes,
                             runtime)
  state, mesh = scorer.state, scorer.mesh
  assert mesh is role_meshes['actor']
  shared = {id(x) for x in jax.tree.leaves(frozen)}
  reference_leaves = jax.tree.leaves(state)
  assert sum(id(x) in shared for x in reference_leaves) == len(shared)
  np.testing.assert_allclose(
      nnx.merge(nnx.graphdef(model), state)(*args)[0], base_logits,
      atol=1e-6)
