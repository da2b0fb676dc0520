"""Shared decoder layers: RMSNorm, RoPE, grouped-query attention, gated MLP.

Parameters carry their logical axes as `axes` metadata ('embed', 'heads',
'kv_heads', 'mlp', 'vocab'); a `stack` dimension (scan-stacked layers) comes
first, named 'layers' (pipeline stages split it). Activations are
constrained through `runtime.sharding.Sharder`, which maps logical names to
the role's mesh by config rules.
"""

from __future__ import annotations

import math

from flax import nnx
import jax
import jax.numpy as jnp

from tunix_pw.models.config import ModelConfig, Rope
from tunix_pw.models.lora import weight
from tunix_pw.runtime.sharding import Sharder

# Large but finite, so that fully masked rows (padding) stay NaN-free.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple, stack: int,
          dtype, init: str = 'normal', fan_in: int = 1) -> nnx.Param:
  """A parameter of `shape` (times `stack` in front, when stacked)."""
  full = ((stack,) if stack else ()) + shape
  if init == 'zeros':
    value = jnp.zeros(full, dtype)
  elif init == 'ones':
    value = jnp.ones(full, dtype)
  else:
    value = (jax.random.normal(rngs.params(), full, jnp.float32) /
             math.sqrt(fan_in)).astype(dtype)
  return nnx.Param(value, axes=(('layers',) if stack else ()) + axes)


class RMSNorm(nnx.Module):
  """RMSNorm in float32; Gemma scales by (1 + w) with w starting at 0."""

  def __init__(self, dim: int, cfg: ModelConfig, *, stack: int, dtype,
               rngs: nnx.Rngs):
    self.plus_one, self.eps = cfg.norm_plus_one, cfg.norm_eps
    self.scale = param(rngs, (dim,), (None,), stack, dtype,
                       'zeros' if self.plus_one else 'ones')

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) +
                                 self.eps)
    scale = self.scale[...].astype(jnp.float32)
    return (normed * (1.0 + scale if self.plus_one else scale)).astype(x.dtype)


def inverse_frequencies(rope: Rope, head_dim: int) -> jax.Array:
  """[head_dim // 2] inverse frequencies, with linear or Llama-3 scaling."""
  inv = 1.0 / rope.theta ** (jnp.arange(0, head_dim, 2, jnp.float32) /
                             head_dim)
  if rope.scaling == 'linear':
    return inv / rope.factor
  if rope.scaling == 'llama3':
    low_wavelen = rope.original_max_position / rope.low_freq_factor
    high_wavelen = rope.original_max_position / rope.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = jnp.where(wavelen > low_wavelen, inv / rope.factor, inv)
    smooth = ((rope.original_max_position / wavelen - rope.low_freq_factor) /
              (rope.high_freq_factor - rope.low_freq_factor))
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(medium, smoothed, scaled)
  return inv


def rotation(positions: jax.Array, rope: Rope,
             head_dim: int) -> tuple[jax.Array, jax.Array]:
  """RoPE's (sin, cos) [B, T, 1, H/2] at positions [B, T]."""
  angles = positions[..., None].astype(jnp.float32) * inverse_frequencies(
      rope, head_dim)  # [B, T, H/2]
  return jnp.sin(angles)[:, :, None], jnp.cos(angles)[:, :, None]


def apply_rope(x: jax.Array, sin_cos: tuple[jax.Array, jax.Array]
               ) -> jax.Array:
  """Rotates [B, T, N, H] by `rotation`'s angles (half-split
  convention)."""
  sin, cos = sin_cos
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


class Attention(nnx.Module):
  """Grouped-query attention (MQA when 1 KV head) with optional QK-norm,
  logit soft-capping and RoPE per attention type."""

  def __init__(self, cfg: ModelConfig, *, stack: int, dtype, rngs: nnx.Rngs):
    d, n, k, h = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.cfg = cfg
    self.q = param(rngs, (d, n, h), ('embed', 'heads', None), stack, dtype,
                   fan_in=d)
    self.k = param(rngs, (d, k, h), ('embed', 'kv_heads', None), stack, dtype,
                   fan_in=d)
    self.v = param(rngs, (d, k, h), ('embed', 'kv_heads', None), stack, dtype,
                   fan_in=d)
    self.o = param(rngs, (n, h, d), ('heads', None, 'embed'), stack, dtype,
                   fan_in=n * h)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(h, cfg, stack=stack, dtype=dtype, rngs=rngs)
      self.k_norm = RMSNorm(h, cfg, stack=stack, dtype=dtype, rngs=rngs)

  def project_kv(self, x: jax.Array, sin_cos: tuple[jax.Array, jax.Array]):
    """Keys and values [B, K, T, H] for x [B, T, D], the keys rotated by
    `rotation`'s (sin, cos)."""
    cfg = self.cfg
    b, t, d = x.shape
    x2 = x.reshape(b * t, d)  # 2-D matmuls: XLA's fastest path
    kv_shape = (b, t, cfg.num_kv_heads, cfg.head_dim)
    k = (x2 @ weight(self, 'k').reshape(d, -1)).reshape(kv_shape)
    v = (x2 @ weight(self, 'v').reshape(d, -1)).reshape(kv_shape)
    if cfg.qk_norm:
      k = self.k_norm(k)
    k = apply_rope(k, sin_cos)
    return k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

  def __call__(self, x: jax.Array, sin_cos: tuple[jax.Array, jax.Array],
               mask: jax.Array, kv: tuple[jax.Array, jax.Array],
               shard: Sharder = Sharder(), with_probs: bool = False,
               keys_hs: bool = False):
    """x [B, T, D]; sin_cos: `rotation`'s at x's positions; kv:
    keys/values [B, K, S, H] (this step's, or the cache after this step's
    write; keys [B, K, H, S] with `keys_hs`); mask [B, T, S] (True =
    attend). Returns the output [B, T, D], and with `with_probs` the
    attention probabilities [B, heads, T, S] too. Where `shard` splits
    the tokens (a sequence axis), each device scores its own queries
    against every key (the keys and values gathered whole)."""
    cfg = self.cfg
    b, t, d = x.shape
    keys, values = kv
    k, n, h = cfg.num_kv_heads, cfg.num_heads, cfg.head_dim
    g, s = n // k, keys.shape[3 if keys_hs else 2]
    q = (x.reshape(b * t, d) @ weight(self, 'q').reshape(d, -1)).reshape(
        b, t, n, h)
    if cfg.qk_norm:
      q = self.q_norm(q)
    q = apply_rope(q, sin_cos) * (cfg.query_scale or h) ** -0.5
    split_tokens = shard.ways('length') > 1
    if split_tokens:
      keys, values = (shard(a, 'batch', 'kv_heads', None, None)
                      for a in (keys, values))
    # Queries of a KV head side by side, one batched matmul: [B, K, G*T, H]
    # (groups outer), or with split tokens [B, K, T*G, H]: a merge keeps
    # only its outer dimension's split, and the scores would be gathered
    # whole on every device.
    order = (0, 2, 1, 3, 4) if split_tokens else (0, 2, 3, 1, 4)
    q = q.reshape(b, t, k, g, h).transpose(order).reshape(b, k, g * t, h)
    if split_tokens:  # what the scores follow (constraining them would
      # keep XLA from fusing their softmax: a larger peak on TPU)
      q = shard(q, 'batch', 'kv_heads', 'length', None)
      mask = shard(mask, 'batch', 'length', None)
    logits = jnp.einsum('BKQH,BKHS->BKQS' if keys_hs else 'BKQH,BKSH->BKQS',
                        q, keys, preferred_element_type=jnp.float32)
    if cfg.attn_softcap:
      logits = jnp.tanh(logits / cfg.attn_softcap) * cfg.attn_softcap
    grouped = (t, g) if split_tokens else (g, t)
    logits = logits.reshape(b, k, *grouped, s)
    logits = jnp.where(
        mask[:, None, :, None] if split_tokens else mask[:, None, None],
        logits, MASK_VALUE)
    probs = jax.nn.softmax(logits, axis=-1).astype(values.dtype)
    out = jnp.einsum('BKQS,BKSH->BKQH', probs.reshape(b, k, g * t, s), values)
    out = out.reshape(b, k, *grouped, h).transpose(
        (0, 2, 1, 3, 4) if split_tokens else (0, 3, 1, 2, 4))
    out = (out.reshape(b * t, n * h) @ weight(self, 'o').reshape(n * h, d)
          ).reshape(b, t, d)
    if not with_probs:
      return out
    # Heads in the queries' order: KV head by KV head, its group within.
    if split_tokens:
      probs = probs.swapaxes(2, 3)
    return out, probs.reshape(b, n, t, s)


class MLP(nnx.Module):
  """Gated MLP: GeGLU (Gemma) or SwiGLU (Llama, Qwen)."""

  def __init__(self, cfg: ModelConfig, *, stack: int, dtype, rngs: nnx.Rngs):
    d, f = cfg.embed_dim, cfg.mlp_dim
    self.activation = cfg.activation
    self.gate = param(rngs, (d, f), ('embed', 'mlp'), stack, dtype, fan_in=d)
    self.up = param(rngs, (d, f), ('embed', 'mlp'), stack, dtype, fan_in=d)
    self.down = param(rngs, (f, d), ('mlp', 'embed'), stack, dtype, fan_in=f)

  def __call__(self, x: jax.Array, shard: Sharder) -> jax.Array:
    b, t, d = x.shape
    x2 = x.reshape(b * t, d)
    gate = x2 @ weight(self, 'gate')
    act = (jax.nn.gelu(gate, approximate=True)
           if self.activation == 'gelu_tanh' else jax.nn.silu(gate))
    hidden = shard((act * (x2 @ weight(self, 'up'))).reshape(b, t, -1),
                   'batch', 'length', 'mlp')
    return (hidden.reshape(b * t, -1) @ weight(self, 'down')).reshape(b, t, d)
