"""Hugging Face checkpoints: config.json + safetensors (single or sharded).

`sources` maps each of our parameters to memory-mapped views of its tensors
in our layout (transposes stay views), so a loader slices out exactly what a
device needs and the host never holds the model whole. `save` writes the same
layout back, so any checkpoint we train can be read by transformers.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
import json
import os
from typing import Any

from flax import nnx
import jax
import numpy as np

from tunix_pw.errors import UsageError
from tunix_pw.models import config as config_lib
from tunix_pw.models import safetensors_io
from tunix_pw.models.config import ModelConfig

CONFIG = 'config.json'
# Tensors of a checkpoint that a text decoder does not use.
_IGNORED = ('vision_tower', 'multi_modal_projector', 'rotary_emb.inv_freq')


def read_config(directory: str) -> ModelConfig:
  path = os.path.join(directory, CONFIG)
  try:
    with open(path) as f:
      return config_lib.from_hf(json.load(f))
  except OSError as e:
    raise UsageError(f'cannot read {path} ({e.strerror}).') from None
  except (ValueError, KeyError) as e:
    raise UsageError(f'{path} is not a supported model config '
                     f'({type(e).__name__}: {e}).') from None


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One checkpoint tensor and how it maps to (a layer of) our parameter."""

  name: str
  shape: tuple[int, ...]
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def _identity(x):
  return x


def _transpose(x):
  return x.T


def _layer_tensor(cfg: ModelConfig, tail: tuple[str, ...]) -> Tensor:
  """The per-layer tensor for our module path tail (suffix without index)."""
  d, n, k, h, f = (cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads,
                   cfg.head_dim, cfg.mlp_dim)

  def heads_in(count):  # [count*H, D] <-> ours [D, count, H]
    return (lambda w: w.reshape(count, h, d).transpose(2, 0, 1),
            lambda x: x.transpose(1, 2, 0).reshape(count * h, d))

  pre_mlp = ('pre_feedforward_layernorm' if cfg.post_norms
             else 'post_attention_layernorm')
  table = {
      ('attn', 'q'): ('self_attn.q_proj.weight', (n * h, d), *heads_in(n)),
      ('attn', 'k'): ('self_attn.k_proj.weight', (k * h, d), *heads_in(k)),
      ('attn', 'v'): ('self_attn.v_proj.weight', (k * h, d), *heads_in(k)),
      ('attn', 'o'): ('self_attn.o_proj.weight', (d, n * h),
                      lambda w: w.reshape(d, n, h).transpose(1, 2, 0),
                      lambda x: x.transpose(2, 0, 1).reshape(d, n * h)),
      ('attn', 'q_norm', 'scale'): ('self_attn.q_norm.weight', (h,),
                                    _identity, _identity),
      ('attn', 'k_norm', 'scale'): ('self_attn.k_norm.weight', (h,),
                                    _identity, _identity),
      ('mlp', 'gate'): ('mlp.gate_proj.weight', (f, d), _transpose,
                        _transpose),
      ('mlp', 'up'): ('mlp.up_proj.weight', (f, d), _transpose, _transpose),
      ('mlp', 'down'): ('mlp.down_proj.weight', (d, f), _transpose,
                        _transpose),
      ('pre_attn_norm', 'scale'): ('input_layernorm.weight', (d,), _identity,
                                   _identity),
      ('pre_mlp_norm', 'scale'): (f'{pre_mlp}.weight', (d,), _identity,
                                  _identity),
      ('post_attn_norm', 'scale'): ('post_attention_layernorm.weight', (d,),
                                    _identity, _identity),
      ('post_mlp_norm', 'scale'): ('post_feedforward_layernorm.weight', (d,),
                                   _identity, _identity),
  }
  return Tensor(*table[tail])


def layer_index(cfg: ModelConfig, group: int, repeat: int,
                position: int) -> int:
  offset = sum(len(p) * r for p, r in cfg.groups[:group])
  return offset + repeat * len(cfg.groups[group][0]) + position


def tensors_for(cfg: ModelConfig, path: tuple[Any, ...],
                prefix: str = 'model.') -> list[Tensor]:
  """The checkpoint tensors of our parameter at `path`: one, or one per
  stacked repeat (in order)."""
  d, v = cfg.embed_dim, cfg.vocab_size
  if path == ('embedding',):
    return [Tensor(f'{prefix}embed_tokens.weight', (v, d), _identity,
                   _identity)]
  if path == ('final_norm', 'scale'):
    return [Tensor(f'{prefix}norm.weight', (d,), _identity, _identity)]
  if path == ('lm_head',):
    return [Tensor('lm_head.weight', (v, d), _transpose, _transpose)]
  if path == ('score',):  # a sequence classifier's head (one label)
    return [Tensor('score.weight', (1, d), _transpose, _transpose)]
  _, group, position, *tail = path
  pattern, repeats = cfg.groups[group]
  template = _layer_tensor(cfg, tuple(tail))
  return [dataclasses.replace(
      template, name=(f'{prefix}layers.'
                      f'{layer_index(cfg, group, r, position)}.{template.name}'))
          for r in range(repeats)]


def _prefix(names: list[str]) -> str:
  for name in names:
    if name.endswith('embed_tokens.weight'):
      return name[:-len('embed_tokens.weight')]
  raise UsageError('the checkpoint has no embed_tokens.weight tensor.')


def decoder_path(path: tuple[Any, ...]) -> tuple[Any, ...]:
  """A parameter's path within the decoder (a value model nests it under
  'decoder'; its head is ('score',))."""
  return path[1:] if path[0] == 'decoder' else path


def sources(directory: str, cfg: ModelConfig,
            abstract_state: nnx.State) -> dict[tuple, list[Callable]]:
  """For every parameter path: per layer (or one), a function giving the
  tensor in our layout as a memory-mapped view. Checks every tensor's shape
  and dtype, and that the checkpoint holds nothing unexpected."""
  store = safetensors_io.SafetensorsDir(directory)
  names = store.names()
  prefix = _prefix(names)
  used, out = set(), {}
  for path, _ in abstract_state.flat_state():
    tensors = tensors_for(cfg, decoder_path(path), prefix)
    if path == ('lm_head',):
      tensors = [dataclasses.replace(tensors[0], name=_lm_head_name(names))]
    for t in tensors:
      _check(store, t)
      used.add(t.name)
    out[path] = [functools.partial(_view, store, t) for t in tensors]
  extra = [n for n in names if n not in used and not any(
      i in n for i in _IGNORED) and not (cfg.tie_embeddings and
                                         n.endswith('lm_head.weight'))]
  if extra:
    raise UsageError(f'unexpected tensor {extra[0]!r} in '
                     f'{store.file_of(extra[0])} for a {cfg.family} model '
                     f'of {cfg.num_layers} layers ({len(extra)} unexpected).')
  return out


def _view(store: safetensors_io.SafetensorsDir, t: Tensor) -> np.ndarray:
  return t.to_ours(store.get(t.name))


def _lm_head_name(names: list[str]) -> str:
  return next((n for n in names if n.endswith('lm_head.weight')),
              'lm_head.weight')


def _check(store: safetensors_io.SafetensorsDir, t: Tensor) -> None:
  array = store.get(t.name)
  if tuple(array.shape) != t.shape:
    raise UsageError(f'tensor {t.name!r} in {store.file_of(t.name)} has shape '
                     f'{tuple(array.shape)}, expected {t.shape} from the '
                     'model config.')
  if array.dtype.kind != 'f' and array.dtype.name != 'bfloat16':
    raise UsageError(f'tensor {t.name!r} in {store.file_of(t.name)} has dtype '
                     f'{array.dtype}, expected a floating point type.')


def to_hf_config(cfg: ModelConfig) -> dict[str, Any]:
  """A transformers config.json for our config (the families' own keys)."""
  model_type = {'gemma': 'gemma', 'gemma2': 'gemma2', 'gemma3': 'gemma3_text',
                'llama3': 'llama', 'qwen3': 'qwen3'}[cfg.family]
  arch = {'gemma': 'GemmaForCausalLM', 'gemma2': 'Gemma2ForCausalLM',
          'gemma3': 'Gemma3ForCausalLM', 'llama3': 'LlamaForCausalLM',
          'qwen3': 'Qwen3ForCausalLM'}[cfg.family]

  def rope(r: config_lib.Rope) -> dict[str, Any]:
    out = {'rope_type': {'none': 'default'}.get(r.scaling, r.scaling),
           'rope_theta': r.theta}
    if r.scaling == 'linear':
      out['factor'] = r.factor
    if r.scaling == 'llama3':
      out.update(factor=r.factor, low_freq_factor=r.low_freq_factor,
                 high_freq_factor=r.high_freq_factor,
                 original_max_position_embeddings=r.original_max_position)
    return out

  out = dict(
      architectures=[arch], model_type=model_type, vocab_size=cfg.vocab_size,
      hidden_size=cfg.embed_dim, intermediate_size=cfg.mlp_dim,
      num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
      num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
      rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
      max_position_embeddings=cfg.max_position, attention_bias=False,
      torch_dtype='float32')
  act = 'gelu_pytorch_tanh' if cfg.activation == 'gelu_tanh' else 'silu'
  out['hidden_activation' if cfg.family.startswith('gemma')
      else 'hidden_act'] = act
  if cfg.family == 'gemma3':
    out['rope_parameters'] = {'full_attention': rope(cfg.rope_global),
                              'sliding_attention': rope(cfg.rope_local)}
  else:
    out['rope_parameters'] = rope(cfg.rope_global)
  if cfg.family in ('gemma2', 'gemma3'):
    out.update(
        query_pre_attn_scalar=cfg.query_scale or cfg.head_dim,
        sliding_window=cfg.sliding_window,
        attn_logit_softcapping=cfg.attn_softcap or None,
        final_logit_softcapping=cfg.final_softcap or None,
        layer_types=['sliding_attention' if t == config_lib.LOCAL
                     else 'full_attention' for t in cfg.layer_types])
  return out


def save(directory: str, cfg: ModelConfig, state: nnx.State,
         dtype=None, classifier_pad_id: int | None = None) -> None:
  """Writes config.json and model.safetensors (one parameter on the host at
  a time, gathered from any sharding). With `classifier_pad_id`, `state`
  is a `value.ValueModel`'s, written as a one-label sequence classifier
  (transformers scores the last token that is not `classifier_pad_id`)."""
  os.makedirs(directory, exist_ok=True)

  def tensors():
    for path, var in state.flat_state():
      path = decoder_path(path)
      value = np.asarray(jax.device_get(var.get_value()))
      if dtype is not None:
        value = value.astype(dtype)
      sources = tensors_for(cfg, path)
      if len(sources) == 1 and path[0] != 'groups':
        yield sources[0].name, sources[0].to_hf(value)
      else:
        for r, t in enumerate(sources):
          yield t.name, np.ascontiguousarray(t.to_hf(value[r]))

  safetensors_io.save(os.path.join(directory, 'model.safetensors'),
                      list(tensors()))
  config = to_hf_config(cfg)
  if classifier_pad_id is not None:
    config.update(
        architectures=[config['architectures'][0].replace(
            'ForCausalLM', 'ForSequenceClassification').replace(
                'Gemma3For', 'Gemma3TextFor')],
        num_labels=1, pad_token_id=classifier_pad_id)
  with open(os.path.join(directory, CONFIG), 'w') as f:
    json.dump(config, f, indent=2)
