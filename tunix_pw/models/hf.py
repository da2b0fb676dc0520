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
# Tensors of a checkpoint that the model does not use (Gemma 3 reads the
# vision tower's last hidden states, not its pooling head).
_IGNORED = ('vision_tower.head.', 'vision_model.head.', 'rotary_emb.inv_freq')


@dataclasses.dataclass(frozen=True)
class Prefixes:
  """Where a checkpoint keeps the decoder's, the vision tower's and the
  projector's tensors."""

  text: str = 'model.'
  vision: str = 'model.vision_tower.'
  projector: str = 'model.multi_modal_projector.'


# What transformers writes for Gemma3ForConditionalGeneration.
VISION_LANGUAGE = Prefixes('model.language_model.')


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


def _vision_tensors(cfg: ModelConfig, path: tuple[str, ...],
                    prefixes: Prefixes) -> list[Tensor]:
  """The checkpoint tensors of the vision tower's parameter at `path`
  (below 'vision'; a block's, one per encoder layer)."""
  v = cfg.vision
  e, f, n, d = v.embed_dim, v.mlp_dim, v.num_heads, cfg.embed_dim
  h, pixels = e // n, (v.channels, v.patch_size, v.patch_size)
  fixed = {
      ('patch',): ('embeddings.patch_embedding.weight', (e,) + pixels,
                   lambda w: w.reshape(e, -1).T,
                   lambda x: x.T.reshape((e,) + pixels)),
      ('patch_bias',): ('embeddings.patch_embedding.bias', (e,)),
      ('position',): ('embeddings.position_embedding.weight',
                      (v.patches, e)),
      ('final_norm', 'scale'): ('post_layernorm.weight', (e,)),
      ('final_norm', 'bias'): ('post_layernorm.bias', (e,)),
  }
  projector = {
      ('soft_norm', 'scale'): ('mm_soft_emb_norm.weight', (e,)),
      ('projection',): ('mm_input_projection_weight', (e, d)),
  }
  heads_out = (lambda w: w.T.reshape(e, n, h), lambda x: x.reshape(e, -1).T)
  block = {
      ('pre_attn_norm', 'scale'): ('layer_norm1.weight', (e,)),
      ('pre_attn_norm', 'bias'): ('layer_norm1.bias', (e,)),
      ('pre_mlp_norm', 'scale'): ('layer_norm2.weight', (e,)),
      ('pre_mlp_norm', 'bias'): ('layer_norm2.bias', (e,)),
      ('attn', 'o'): ('self_attn.out_proj.weight', (e, e),
                      lambda w: w.T.reshape(n, h, e),
                      lambda x: x.reshape(e, e).T),
      ('attn', 'o_bias'): ('self_attn.out_proj.bias', (e,)),
      ('mlp', 'up'): ('mlp.fc1.weight', (f, e), _transpose, _transpose),
      ('mlp', 'up_bias'): ('mlp.fc1.bias', (f,)),
      ('mlp', 'down'): ('mlp.fc2.weight', (e, f), _transpose, _transpose),
      ('mlp', 'down_bias'): ('mlp.fc2.bias', (e,)),
  }
  for name in 'qkv':
    block[('attn', name)] = (f'self_attn.{name}_proj.weight', (e, e),
                             *heads_out)
    block[('attn', f'{name}_bias')] = (
        f'self_attn.{name}_proj.bias', (e,), lambda b: b.reshape(n, h),
        lambda x: x.reshape(-1))

  def tensor(name, shape, to_ours=_identity, to_hf=_identity):
    return Tensor(name, shape, to_ours, to_hf)
  if path in fixed:
    return [tensor(prefixes.vision + fixed[path][0], *fixed[path][1:])]
  if path in projector:
    return [tensor(prefixes.projector + projector[path][0],
                   *projector[path][1:])]
  name, *rest = block[tuple(path[1:])]
  return [tensor(f'{prefixes.vision}encoder.layers.{i}.{name}', *rest)
          for i in range(v.num_layers)]


def layer_index(cfg: ModelConfig, group: int, repeat: int,
                position: int) -> int:
  offset = sum(len(p) * r for p, r in cfg.groups[:group])
  return offset + repeat * len(cfg.groups[group][0]) + position


def tensors_for(cfg: ModelConfig, path: tuple[Any, ...],
                prefixes: Prefixes = Prefixes()) -> list[Tensor]:
  """The checkpoint tensors of our parameter at `path`: one, or one per
  stacked repeat (in order)."""
  d, v = cfg.embed_dim, cfg.vocab_size
  prefix = prefixes.text
  if path[0] == 'vision':
    return _vision_tensors(cfg, path[1:], prefixes)
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


def _prefix(names: list[str], tail: str) -> str:
  for name in names:
    if name.endswith(tail):
      return name[:-len(tail)]
  raise UsageError(f'the checkpoint has no {tail} tensor.')


def _prefixes(names: list[str], cfg: ModelConfig) -> Prefixes:
  text = _prefix(names, 'embed_tokens.weight')
  if not cfg.vision:
    return Prefixes(text)
  return Prefixes(text, _prefix(names, 'embeddings.patch_embedding.weight'),
                  _prefix(names, 'mm_input_projection_weight'))


def decoder_path(path: tuple[Any, ...]) -> tuple[Any, ...]:
  """A parameter's path within the decoder (a value model nests it under
  'decoder'; its head is ('score',))."""
  return path[1:] if path[0] == 'decoder' else path


def stacked(path: tuple[Any, ...]) -> bool:
  """Whether the parameter at `path` stacks one tensor per layer."""
  path = decoder_path(path)
  return path[0] == 'groups' or path[:2] == ('vision', 'blocks')


def sources(directory: str, cfg: ModelConfig,
            abstract_state: nnx.State) -> dict[tuple, list[Callable]]:
  """For every parameter path: per layer (or one), a function giving the
  tensor in our layout as a memory-mapped view. Checks every tensor's shape
  and dtype, and that the checkpoint holds nothing unexpected."""
  store = safetensors_io.SafetensorsDir(directory)
  names = store.names()
  prefixes = _prefixes(names, cfg)
  used, out = set(), {}
  for path, _ in abstract_state.flat_state():
    tensors = tensors_for(cfg, decoder_path(path), prefixes)
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
  v = cfg.vision
  if not v:
    return out
  return dict(
      architectures=['Gemma3ForConditionalGeneration'], model_type='gemma3',
      text_config=out, tie_word_embeddings=cfg.tie_embeddings,
      mm_tokens_per_image=v.tokens_per_image, image_token_index=v.image_token,
      boi_token_index=v.begin_image, eoi_token_index=v.end_image,
      torch_dtype='float32',
      vision_config=dict(
          model_type='siglip_vision_model', hidden_size=v.embed_dim,
          intermediate_size=v.mlp_dim, num_hidden_layers=v.num_layers,
          num_attention_heads=v.num_heads, image_size=v.image_size,
          patch_size=v.patch_size, num_channels=v.channels,
          layer_norm_eps=v.norm_eps, hidden_act='gelu_pytorch_tanh',
          vision_use_head=False))


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
      sources = tensors_for(cfg, path, VISION_LANGUAGE if cfg.vision
                            else Prefixes())
      if not stacked(path):
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
