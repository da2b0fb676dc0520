"""LoRA/QLoRA: the base stays bit-identical while adapters train; merged
weights give the adapter model's logits; LoRA checkpoints hold adapters
only; the merged model exports to safetensors."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.train.test_step import batch_with_unequal_tokens
from tunix_pw.jobs.sft import sft_loss
from tunix_pw.models import checkpoints, hf, lora, presets
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
  restored, _, step = Checkpointer(str(tmp_path)).restore(state)
  assert step == 3
  saved = ['/'.join(map(str, p)) for p, _ in restored.params.flat_state()]
  assert saved and all('_lora_' in p for p in saved)
  for a, b in zip(jax.tree.leaves(restored.params),
                  jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(a, b)
