"""ModelConfig: the shape and behaviour of a decoder, for every family.

One dataclass covers Gemma 1/2/3, Llama 3 and Qwen 3; the families differ in
a handful of switches (norm style, activation, soft-caps, QK-norm, per-layer
attention type and RoPE). Gemma 3's vision-language models add a `Vision`
(the SigLIP tower and the projector to the decoder's image tokens).
`from_hf` reads a Hugging Face `config.json` in its old and new spellings.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
from typing import Any

GLOBAL = 'global'
LOCAL = 'local'
FAMILIES = ('gemma', 'gemma2', 'gemma3', 'llama3', 'qwen3')


@dataclasses.dataclass(frozen=True)
class Rope:
  """RoPE for one attention type: base, and optional scaling."""

  theta: float = 10_000.0
  scaling: str = 'none'  # 'none' | 'linear' | 'llama3'
  factor: float = 1.0
  low_freq_factor: float = 1.0  # llama3
  high_freq_factor: float = 4.0  # llama3
  original_max_position: int = 8192  # llama3


@dataclasses.dataclass(frozen=True)
class Vision:
  """Gemma 3's image encoder (a SigLIP vision transformer over
  `image_size`² pixels in `patch_size`² patches) and its projector, which
  pools the patches to `tokens_per_image` soft tokens that replace the
  prompt's `image_token`s."""

  embed_dim: int
  mlp_dim: int
  num_layers: int
  num_heads: int
  image_size: int
  patch_size: int
  tokens_per_image: int
  image_token: int
  begin_image: int = 255_999  # the tokens around an image's soft tokens
  end_image: int = 256_000
  channels: int = 3
  norm_eps: float = 1e-6

  def __post_init__(self):
    side = self.image_size // self.patch_size
    pooled = round(self.tokens_per_image ** 0.5)
    if (self.image_size % self.patch_size or pooled ** 2 !=
        self.tokens_per_image or side % pooled or self.embed_dim %
        self.num_heads):
      raise ValueError(
          f'a {self.image_size}-pixel image in {self.patch_size}-pixel '
          f'patches does not pool to {self.tokens_per_image} tokens, or '
          f'{self.num_heads} heads do not divide {self.embed_dim}')

  @property
  def patches(self) -> int:
    return (self.image_size // self.patch_size) ** 2


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Everything that defines a decoder's parameters and forward pass."""

  family: str
  vocab_size: int
  embed_dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  activation: str = 'gelu_tanh'  # 'gelu_tanh' (GeGLU) | 'silu' (SwiGLU)
  norm_eps: float = 1e-6
  norm_plus_one: bool = True  # Gemma scales by (1 + w); Llama/Qwen by w
  post_norms: bool = False  # Gemma 2/3: norms after attention and MLP too
  qk_norm: bool = False  # Gemma 3, Qwen 3
  embed_scale: bool = True  # Gemma: embeddings times sqrt(embed_dim)
  tie_embeddings: bool = True
  query_scale: int = 0  # 0: head_dim ** -0.5; else this ** -0.5
  attn_softcap: float = 0.0  # 0: off
  final_softcap: float = 0.0
  sliding_window: int = 0
  layer_types: tuple[str, ...] = ()  # per layer: GLOBAL | LOCAL
  rope_global: Rope = Rope()
  rope_local: Rope = Rope()
  scan_period: int = 1  # layers per scanned block (Gemma 2: 2, Gemma 3: 6)
  max_position: int = 8192
  vision: Vision | None = None  # Gemma 3's image encoder, when it has one

  def __post_init__(self):
    if not self.layer_types:
      object.__setattr__(self, 'layer_types', (GLOBAL,) * self.num_layers)
    if len(self.layer_types) != self.num_layers:
      raise ValueError(f'{len(self.layer_types)} layer types for '
                       f'{self.num_layers} layers')
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f'{self.num_heads} heads do not group over '
                       f'{self.num_kv_heads} KV heads')

  @property
  def groups(self) -> tuple[tuple[tuple[str, ...], int], ...]:
    """Layers as (block pattern, repeats) groups for scanning: Gemma 3's 26
    layers are 4 blocks of 6 and 1 block of the 2 remaining."""
    period = self.scan_period
    types = self.layer_types
    if any(types[i] != types[i % period] for i in range(len(types))):
      period = len(types)  # not periodic: one block of every layer
    repeats, rest = divmod(len(types), period)
    groups = [(types[:period], repeats)]
    if rest:
      groups.append((types[repeats * period:], 1))
    return tuple(groups)

  def rope(self, layer_type: str) -> Rope:
    return self.rope_local if layer_type == LOCAL else self.rope_global

  def replace(self, **changes: Any) -> 'ModelConfig':
    """A copy with `changes`; a new layer count keeps the layer pattern."""
    if 'num_layers' in changes and 'layer_types' not in changes:
      pattern = self.layer_types[:self.scan_period]
      changes['layer_types'] = tuple(pattern[i % len(pattern)]
                                     for i in range(changes['num_layers']))
    return dataclasses.replace(self, **changes)


# ------------------------------------------------------ Hugging Face configs


def _rope_from_hf(params: Mapping[str, Any] | None, theta: float) -> Rope:
  params = dict(params or {})
  kind = params.get('rope_type', params.get('type', 'default'))
  theta = float(params.get('rope_theta', theta))
  if kind in ('default', None):
    return Rope(theta)
  if kind == 'linear':
    return Rope(theta, 'linear', float(params['factor']))
  if kind == 'llama3':
    return Rope(theta, 'llama3', float(params['factor']),
                float(params['low_freq_factor']),
                float(params['high_freq_factor']),
                int(params['original_max_position_embeddings']))
  raise ValueError(f'unsupported RoPE scaling {kind!r}')


def _hf_layer_types(cfg: Mapping[str, Any], family: str) -> tuple[str, ...]:
  n = cfg['num_hidden_layers']
  if cfg.get('layer_types'):
    return tuple(LOCAL if t == 'sliding_attention' else GLOBAL
                 for t in cfg['layer_types'])
  if family == 'gemma2':
    return tuple(LOCAL if i % 2 == 0 else GLOBAL for i in range(n))
  if family == 'gemma3':
    period = cfg.get('sliding_window_pattern', 6)
    return tuple(LOCAL if (i + 1) % period else GLOBAL for i in range(n))
  return (GLOBAL,) * n


_HF_FAMILIES = {'gemma': 'gemma', 'gemma2': 'gemma2', 'gemma3_text': 'gemma3',
                'gemma3': 'gemma3', 'llama': 'llama3', 'qwen3': 'qwen3'}


def from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
  """A ModelConfig from a Hugging Face config.json dict (Gemma 3's
  multimodal configs contribute their text_config)."""
  model_type = cfg.get('model_type')
  if model_type not in _HF_FAMILIES:
    raise ValueError(f'unsupported model_type {model_type!r}; supported: '
                     f'{", ".join(sorted(_HF_FAMILIES))}')
  vision = None
  if model_type == 'gemma3' and 'text_config' in cfg:
    vision = _vision_from_hf(cfg)
    cfg = {**cfg['text_config'], 'model_type': 'gemma3_text'}
  family = _HF_FAMILIES[model_type]
  gemma = family.startswith('gemma')
  heads = cfg['num_attention_heads']
  head_dim = cfg.get('head_dim') or cfg['hidden_size'] // heads
  rope = cfg.get('rope_parameters')
  theta = cfg.get('rope_theta', 10_000.0)
  if family == 'gemma3':
    if rope and 'full_attention' in rope:
      rope_global = _rope_from_hf(rope['full_attention'], 1_000_000.0)
      rope_local = _rope_from_hf(rope['sliding_attention'], 10_000.0)
    else:
      rope_global = _rope_from_hf(cfg.get('rope_scaling'),
                                  cfg.get('rope_theta', 1_000_000.0))
      rope_local = Rope(cfg.get('rope_local_base_freq', 10_000.0))
  else:
    rope_global = _rope_from_hf(rope or cfg.get('rope_scaling'), theta)
    rope_local = rope_global
  activation = cfg.get('hidden_activation') or cfg.get('hidden_act', 'silu')
  return ModelConfig(
      family=family,
      vocab_size=cfg['vocab_size'],
      embed_dim=cfg['hidden_size'],
      num_layers=cfg['num_hidden_layers'],
      num_heads=heads,
      num_kv_heads=cfg.get('num_key_value_heads', heads),
      head_dim=head_dim,
      mlp_dim=cfg['intermediate_size'],
      activation='gelu_tanh' if 'gelu' in activation else 'silu',
      norm_eps=cfg.get('rms_norm_eps', 1e-6),
      norm_plus_one=gemma,
      post_norms=family in ('gemma2', 'gemma3'),
      qk_norm=family in ('gemma3', 'qwen3'),
      embed_scale=gemma,
      tie_embeddings=cfg.get('tie_word_embeddings', gemma),
      query_scale=int(cfg.get('query_pre_attn_scalar') or 0)
      if family in ('gemma2', 'gemma3') else 0,
      attn_softcap=float(cfg.get('attn_logit_softcapping') or 0.0),
      final_softcap=float(cfg.get('final_logit_softcapping') or 0.0),
      sliding_window=int(cfg.get('sliding_window') or 0)
      if family in ('gemma2', 'gemma3') else 0,
      layer_types=_hf_layer_types(cfg, family),
      rope_global=rope_global,
      rope_local=rope_local,
      scan_period={'gemma2': 2, 'gemma3': 6}.get(family, 1),
      max_position=cfg.get('max_position_embeddings', 8192),
      vision=vision,
  )


def _vision_from_hf(cfg: Mapping[str, Any]) -> Vision | None:
  """A Gemma 3 config's image encoder (None without a vision_config)."""
  v = cfg.get('vision_config')
  if not v:
    return None
  return Vision(
      embed_dim=v['hidden_size'], mlp_dim=v['intermediate_size'],
      num_layers=v['num_hidden_layers'], num_heads=v['num_attention_heads'],
      image_size=v['image_size'], patch_size=v['patch_size'],
      tokens_per_image=cfg.get('mm_tokens_per_image', 256),
      image_token=cfg.get('image_token_index',
                          cfg.get('image_token_id', 262_144)),
      begin_image=cfg.get('boi_token_index', 255_999),
      end_image=cfg.get('eoi_token_index', 256_000),
      channels=v.get('num_channels', 3),
      norm_eps=v.get('layer_norm_eps', 1e-6))
