"""Kaggle's Gemma checkpoints: the Flax/Orbax parameter trees that Google's
own Gemma code writes (Gemma 1, 2 and 3).

The tree is `transformer/` + per layer `layer_<i>/attn/{q_einsum [N, D, H],
kv_einsum [2, K, D, H] or qkv_einsum [3, N, D, H], attn_vec_einsum
[N, H, D], _query_norm, _key_norm}`, `layer_<i>/mlp/{gating_einsum,
linear [F, D]}`, `layer_<i>/{pre,post}_{attention,ffw}_norm`, plus
`embedder/input_embedding [V, D]` and `final_norm`. Gemma 1 lays
`gating_einsum` out as [2, D, F], Gemma 2 and 3 as [2, F, D]; the shape
tells. Kaggle ships no config: the model preset names the architecture and
the checkpoint's shapes are checked against it.
"""

from __future__ import annotations

from collections.abc import Callable
import functools
import os
from typing import Any

from flax import nnx
import numpy as np

from tunix_pw.errors import UsageError
from tunix_pw.models import hf
from tunix_pw.models.config import ModelConfig


def is_kaggle(directory: str) -> bool:
  """An Orbax checkpoint (Kaggle ships these) rather than safetensors."""
  return any(os.path.exists(os.path.join(directory, f))
             for f in ('_METADATA', '_CHECKPOINT_METADATA', 'checkpoint'))


def _flatten(tree: Any, prefix: str = '') -> dict[str, np.ndarray]:
  """Every array under a '/'-joined path, without the 'transformer/' root
  (Kaggle trees mix '/'-joined keys and nesting)."""
  if not isinstance(tree, dict):
    return {prefix.removeprefix('transformer/'): np.asarray(tree)}
  out = {}
  for key, value in tree.items():
    out.update(_flatten(value, f'{prefix}/{key}' if prefix else key))
  return out


def read(directory: str) -> dict[str, np.ndarray]:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  try:
    tree = ocp.PyTreeCheckpointer().restore(os.path.abspath(directory))
  except Exception as e:  # Orbax raises many types for unreadable dirs
    raise UsageError(f'{directory} is not a readable Orbax checkpoint '
                     f'({type(e).__name__}: {e}).') from None
  return _flatten(tree)


def _layer_views(cfg: ModelConfig, arrays: dict[str, np.ndarray],
                 layer: int) -> dict[tuple[str, ...], Callable[[], Any]]:
  """Our layer parameters as functions of the Kaggle arrays."""
  p = f'layer_{layer}/'
  d, f = cfg.embed_dim, cfg.mlp_dim

  def get(key):
    if p + key not in arrays:
      raise UsageError(f'tensor {p + key!r} is missing from the Kaggle '
                       'checkpoint.')
    return arrays[p + key]

  def qkv(which):
    if p + 'attn/qkv_einsum/w' in arrays:  # multi-head: [3, N, D, H]
      return get('attn/qkv_einsum/w')[which].transpose(1, 0, 2)
    if which == 0:
      return get('attn/q_einsum/w').transpose(1, 0, 2)
    return get('attn/kv_einsum/w')[which - 1].transpose(1, 0, 2)

  def gating(which):
    w = get('mlp/gating_einsum/w')
    if w.shape[1:] == (d, f):
      return w[which]
    if w.shape[1:] == (f, d):
      return w[which].T
    raise UsageError(f'tensor {p}mlp/gating_einsum/w has shape {w.shape}, '
                     f'expected (2, {d}, {f}) or (2, {f}, {d}).')

  return {
      ('attn', 'q'): lambda: qkv(0),
      ('attn', 'k'): lambda: qkv(1),
      ('attn', 'v'): lambda: qkv(2),
      ('attn', 'o'): lambda: get('attn/attn_vec_einsum/w'),
      ('attn', 'q_norm', 'scale'): lambda: get('attn/_query_norm/scale'),
      ('attn', 'k_norm', 'scale'): lambda: get('attn/_key_norm/scale'),
      ('mlp', 'gate'): lambda: gating(0),
      ('mlp', 'up'): lambda: gating(1),
      ('mlp', 'down'): lambda: get('mlp/linear/w'),
      ('pre_attn_norm', 'scale'): lambda: get('pre_attention_norm/scale'),
      ('pre_mlp_norm', 'scale'): lambda: get('pre_ffw_norm/scale'),
      ('post_attn_norm', 'scale'): lambda: get('post_attention_norm/scale'),
      ('post_mlp_norm', 'scale'): lambda: get('post_ffw_norm/scale'),
  }


def sources(directory: str, cfg: ModelConfig,
            abstract_state: nnx.State) -> dict[tuple, list[Callable]]:
  """Per parameter path, per layer: our-layout arrays from the Kaggle tree,
  checked against the shapes the preset expects."""
  if not cfg.family.startswith('gemma'):
    raise UsageError(f'Kaggle checkpoints hold Gemma models; the preset is a '
                     f'{cfg.family} model.')
  arrays = read(directory)
  vocab = cfg.vocab_size

  def embedding():
    table = arrays.get('embedder/input_embedding')
    if table is None:
      raise UsageError(f'tensor embedder/input_embedding is missing from the '
                       f'Kaggle checkpoint in {directory}.')
    # Gemma 1 tables carry 128 padding rows beyond the vocabulary.
    return table[:vocab] if table.shape[0] >= vocab else table

  top = {('embedding',): embedding,
         ('final_norm', 'scale'): lambda: arrays['final_norm/scale']}
  used_layers = set()
  out = {}
  for path, var in abstract_state.flat_state():
    if path[0] != 'groups':
      out[path] = [top[path]]
      continue
    _, group, position, *tail = path
    layers = [hf.layer_index(cfg, group, r, position)
              for r in range(cfg.groups[group][1])]
    used_layers.update(layers)
    out[path] = [functools.partial(_checked, _layer_views(cfg, arrays, i),
                                   tuple(tail), var.get_value().shape[1:],
                                   f'layer_{i}', directory) for i in layers]
  extra = [k for k in arrays if k.startswith('layer_') and
           int(k.split('/')[0].removeprefix('layer_')) not in used_layers]
  if extra:
    raise UsageError(f'unexpected tensor {extra[0]!r} in the Kaggle '
                     f'checkpoint {directory}: the preset has '
                     f'{cfg.num_layers} layers.')
  return out


def _checked(views, tail, shape, layer, directory) -> np.ndarray:
  value = views[tail]()
  if tuple(value.shape) != tuple(shape):
    raise UsageError(f'the Kaggle checkpoint {directory} gives {layer} '
                     f'{"/".join(tail)} the shape {tuple(value.shape)}, but '
                     f'the preset expects {tuple(shape)}.')
  return value
