"""Kaggle's Gemma layout, as Google's own code lays it out: google-tunix's
Gemma modules (random init) give the parameters, saved the way Kaggle ships
them; tunix's own Kaggle reader accepts the tree; our loader's logits equal
tunix's forward pass and the equivalent Hugging Face checkpoint's."""

import dataclasses

from flax import nnx
import flax
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from tunix.models.gemma import model as tunix_gemma
from tunix.models.gemma import params as tunix_gemma_params
from tunix.models.gemma3 import model as tunix_gemma3
from tunix.models.gemma3 import params as tunix_gemma3_params

from tests.models import hf_models
from tunix_pw.errors import UsageError
from tunix_pw.models import checkpoints, hf
from tunix_pw.models.config import GLOBAL, LOCAL, ModelConfig, Rope

V, D, F, N, H, T = 97, 64, 96, 4, 16, 12


def randomize(module, seed):
  """Every parameter random (tunix initialises the MLP to zeros)."""
  state = nnx.state(module, nnx.Param)
  leaves, treedef = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  nnx.update(module, jax.tree.unflatten(treedef, [
      0.2 * jax.random.normal(k, x.shape, x.dtype)
      for k, x in zip(keys, leaves)]))


def kaggle_tree(module, gemma3: bool):
  """The module's parameters under Kaggle's flat keys (inverse of tunix's
  documented Kaggle -> nnx mapping)."""
  flat = {}
  for path, var in nnx.state(module, nnx.Param).flat_state():
    value = np.asarray(var.get_value())
    if path[0] == 'embedder':
      flat[('transformer/embedder', path[-1])] = value
    elif path[0] == 'final_norm':
      flat[('transformer/final_norm', 'scale')] = value
    else:
      _, i, *rest = path
      layer = f'transformer/layer_{i}'
      if rest[:2] == ['mlp', 'gate_proj']:
        up = np.asarray(module.layers[i].mlp.up_proj.kernel[...])
        gating = np.stack([value, up])  # Gemma 1/2: [2, D, F]
        flat[(f'{layer}/mlp/gating_einsum', 'w')] = (
            gating.transpose(0, 2, 1) if gemma3 else gating)  # Gemma 3: [2, F, D]
      elif rest[:2] == ['mlp', 'up_proj']:
        continue
      elif rest[:2] == ['mlp', 'down_proj']:
        flat[(f'{layer}/mlp/linear', 'w')] = value
      else:
        module_path = [
            'post_attention_norm' if (p == 'post_attn_norm') else p
            for p in rest[:-1]]
        flat[('/'.join([layer] + module_path), rest[-1])] = value
  return flax.traverse_util.unflatten_dict(flat)


def save(tree, path):
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(str(path), tree)
  checkpointer.wait_until_finished()


TUNIX_GEMMA2 = tunix_gemma.ModelConfig(
    num_layers=4, num_embed=V, embed_dim=D, hidden_dim=F, num_heads=N,
    head_dim=H, num_kv_heads=2, final_logit_softcap=2.0,
    use_post_attn_norm=True, use_post_ffw_norm=True,
    attention_types=(tunix_gemma.AttentionType.LOCAL_SLIDING,
                     tunix_gemma.AttentionType.GLOBAL) * 2,
    attn_logits_soft_cap=1.5, sliding_window_size=4)
TUNIX_GEMMA1_MHA = dataclasses.replace(
    TUNIX_GEMMA2, num_layers=2, num_kv_heads=N, final_logit_softcap=None,
    use_post_attn_norm=False, use_post_ffw_norm=False,
    attention_types=(tunix_gemma.AttentionType.GLOBAL,) * 2,
    attn_logits_soft_cap=None, sliding_window_size=None)
TUNIX_GEMMA3 = tunix_gemma3.ModelConfig(
    num_layers=7, num_embed=V, embed_dim=D, hidden_dim=F, num_heads=N,
    head_dim=H, num_kv_heads=2, sliding_window_size=4,
    local_base_frequency=10_000, global_base_frequency=1_000_000,
    global_scale_factor=8.0, param_dtype=jnp.float32)

OURS = {
    'gemma2': ModelConfig(
        family='gemma2', vocab_size=V, embed_dim=D, num_layers=4,
        num_heads=N, num_kv_heads=2, head_dim=H, mlp_dim=F, post_norms=True,
        attn_softcap=1.5, final_softcap=2.0, sliding_window=4, scan_period=2,
        layer_types=(LOCAL, GLOBAL) * 2),
    'gemma1_mha': ModelConfig(
        family='gemma', vocab_size=V, embed_dim=D, num_layers=2, num_heads=N,
        num_kv_heads=N, head_dim=H, mlp_dim=F),
    'gemma3': ModelConfig(
        family='gemma3', vocab_size=V, embed_dim=D, num_layers=7,
        num_heads=N, num_kv_heads=2, head_dim=H, mlp_dim=F, post_norms=True,
        qk_norm=True, sliding_window=4, scan_period=6,
        layer_types=tuple(LOCAL if (i + 1) % 6 else GLOBAL for i in range(7)),
        rope_global=Rope(1_000_000.0, 'linear', 8.0),
        rope_local=Rope(10_000.0)),
}


def tunix_logits(module, tokens):
  positions = jnp.broadcast_to(jnp.arange(T), tokens.shape)
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (2, T, T))
  return np.asarray(module(tokens, positions, None, mask)[0])


@pytest.mark.parametrize('name', ['gemma2', 'gemma1_mha', 'gemma3'])
def test_kaggle_layout_loads_with_tunix_logits(name, tmp_path):
  gemma3 = name == 'gemma3'
  if gemma3:
    module = tunix_gemma3.Gemma3(TUNIX_GEMMA3, rngs=nnx.Rngs(0))
  else:
    config = TUNIX_GEMMA2 if name == 'gemma2' else TUNIX_GEMMA1_MHA
    module = tunix_gemma.Gemma(config, rngs=nnx.Rngs(0))
  randomize(module, seed=1)
  tree = kaggle_tree(module, gemma3)
  save(tree, tmp_path / 'kaggle')

  # Google's own Kaggle reader accepts the tree and rebuilds the module.
  if gemma3:
    reread = tunix_gemma3_params.create_model_from_checkpoint(
        str(tmp_path / 'kaggle'), TUNIX_GEMMA3, dtype=jnp.float32)
  else:
    reread = tunix_gemma.module_from_linen_variables(
        module_factory=lambda: tunix_gemma.Gemma(config, rngs=nnx.Rngs(0)),
        variables=tunix_gemma_params.load_and_format_params(
            str(tmp_path / 'kaggle'))['transformer'],
        map_key_fn=tunix_gemma._map_linen_var_names,  # pylint: disable=protected-access
        assign_val_fn=tunix_gemma._assign_linen_params_to_nnx_state)  # pylint: disable=protected-access
  for a, b in zip(jax.tree.leaves(nnx.state(module, nnx.Param)),
                  jax.tree.leaves(nnx.state(reread, nnx.Param))):
    np.testing.assert_array_equal(a, b)

  ours, cfg = checkpoints.load(str(tmp_path / 'kaggle'), OURS[name])
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, V, (2, T)))
  positions = jnp.broadcast_to(jnp.arange(T), (2, T))
  got, _ = ours(tokens, positions, jnp.ones_like(tokens))
  np.testing.assert_allclose(got, tunix_logits(module, tokens), atol=1e-4,
                             rtol=0)

  # The same weights as a Hugging Face checkpoint give the same logits.
  hf.save(str(tmp_path / 'hf'), cfg, nnx.state(ours))
  import transformers  # pylint: disable=g-import-not-at-top
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path / 'hf'), attn_implementation='eager').eval()
  mask = np.ones((2, T), np.int64)
  expected = hf_models.logits(torch_model, np.asarray(tokens), mask,
                              np.asarray(positions))
  np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def test_kaggle_shape_mismatch_names_the_tensor(tmp_path):
  module = tunix_gemma.Gemma(TUNIX_GEMMA2, rngs=nnx.Rngs(0))
  save(kaggle_tree(module, False), tmp_path / 'kaggle')
  wrong = OURS['gemma2'].replace(mlp_dim=F * 2)
  with pytest.raises(UsageError, match='layer_0 mlp/down the shape'):
    checkpoints.load(str(tmp_path / 'kaggle'), wrong)
  with pytest.raises(UsageError, match='give the model preset'):
    checkpoints.load(str(tmp_path / 'kaggle'))
