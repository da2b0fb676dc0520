"""Gemma 3's image encoder: a SigLIP vision transformer and the projector
that turns an image into the decoder's soft tokens.

An image [C, H, W] (the processor's normalised pixels) is cut into
`patch_size`² patches, embedded with learned positions, and run through
bidirectional pre-norm transformer blocks (scan-stacked, like the
decoder's layers); the projector average-pools the patch grid to
`tokens_per_image` tokens, RMS-normalises them and maps them to the
decoder's width. The weights read through `lora.weight` under the
decoder's names (attn q/k/v/o, mlp up/down), so a LoRA can target the
tower ('vision/.*') or leave it frozen.
"""

from __future__ import annotations

import math

from flax import nnx
import jax
import jax.numpy as jnp

from tunix_pw.models import layers
from tunix_pw.models.config import ModelConfig
from tunix_pw.models.lora import weight


class LayerNorm(nnx.Module):
  """LayerNorm with scale and bias, in float32."""

  def __init__(self, dim: int, eps: float, *, stack: int, dtype,
               rngs: nnx.Rngs):
    self.eps = eps
    self.scale = layers.param(rngs, (dim,), (None,), stack, dtype, 'ones')
    self.bias = layers.param(rngs, (dim,), (None,), stack, dtype, 'zeros')

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, -1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), -1, keepdims=True)
    normed = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
    return (normed * self.scale[...].astype(jnp.float32) +
            self.bias[...].astype(jnp.float32)).astype(x.dtype)


def _dense(module: nnx.Module, name: str, x: jax.Array,
           in_dims: int = 1) -> jax.Array:
  """x [..., in...] times the module's weight `name` [in..., out...] plus
  its bias `name`_bias [out...]."""
  w = weight(module, name)
  fan_in = math.prod(w.shape[:in_dims])
  out = x.reshape(-1, fan_in) @ w.reshape(fan_in, -1)
  bias = getattr(module, f'{name}_bias')[...]
  return out.reshape(x.shape[:x.ndim - in_dims] + bias.shape) + bias


class Attention(nnx.Module):
  """Bidirectional multi-head attention with biases."""

  def __init__(self, dim: int, heads: int, *, stack: int, dtype,
               rngs: nnx.Rngs):
    h = dim // heads
    for name in ('q', 'k', 'v'):
      setattr(self, name, layers.param(rngs, (dim, heads, h),
                                       ('embed', 'heads', None), stack,
                                       dtype, fan_in=dim))
      setattr(self, f'{name}_bias', layers.param(
          rngs, (heads, h), ('heads', None), stack, dtype, 'zeros'))
    self.o = layers.param(rngs, (heads, h, dim), ('heads', None, 'embed'),
                          stack, dtype, fan_in=dim)
    self.o_bias = layers.param(rngs, (dim,), ('embed',), stack, dtype,
                               'zeros')

  def __call__(self, x: jax.Array) -> jax.Array:
    q, k, v = (_dense(self, name, x) for name in ('q', 'k', 'v'))
    scores = jnp.einsum('BTNH,BSNH->BNTS', q * q.shape[-1] ** -0.5, k,
                        preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return _dense(self, 'o', jnp.einsum('BNTS,BSNH->BTNH', probs, v),
                  in_dims=2)


class MLP(nnx.Module):
  """up, GELU (tanh), down; with biases."""

  def __init__(self, dim: int, hidden: int, *, stack: int, dtype,
               rngs: nnx.Rngs):
    self.up = layers.param(rngs, (dim, hidden), ('embed', 'mlp'), stack,
                           dtype, fan_in=dim)
    self.up_bias = layers.param(rngs, (hidden,), ('mlp',), stack, dtype,
                                'zeros')
    self.down = layers.param(rngs, (hidden, dim), ('mlp', 'embed'), stack,
                             dtype, fan_in=hidden)
    self.down_bias = layers.param(rngs, (dim,), ('embed',), stack, dtype,
                                  'zeros')

  def __call__(self, x: jax.Array) -> jax.Array:
    return _dense(self, 'down',
                  jax.nn.gelu(_dense(self, 'up', x), approximate=True))


class Block(nnx.Module):
  """One encoder layer: x + attn(norm(x)), then x + mlp(norm(x))."""

  def __init__(self, cfg: ModelConfig, *, stack: int, dtype,
               rngs: nnx.Rngs):
    v = cfg.vision
    norm = lambda: LayerNorm(v.embed_dim, v.norm_eps, stack=stack,
                             dtype=dtype, rngs=rngs)
    self.pre_attn_norm = norm()
    self.attn = Attention(v.embed_dim, v.num_heads, stack=stack, dtype=dtype,
                          rngs=rngs)
    self.pre_mlp_norm = norm()
    self.mlp = MLP(v.embed_dim, v.mlp_dim, stack=stack, dtype=dtype,
                   rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x + self.attn(self.pre_attn_norm(x))
    return x + self.mlp(self.pre_mlp_norm(x))


class Tower(nnx.Module):
  """Images [N, C, H, W] -> soft tokens [N, tokens_per_image, D]."""

  def __init__(self, cfg: ModelConfig, *, param_dtype, dtype,
               rngs: nnx.Rngs):
    v = self.vision = cfg.vision
    self.dtype = dtype
    e, pixels = v.embed_dim, v.channels * v.patch_size ** 2
    self.patch = layers.param(rngs, (pixels, e), (None, 'embed'), 0,
                              param_dtype, fan_in=pixels)
    self.patch_bias = layers.param(rngs, (e,), ('embed',), 0, param_dtype,
                                   'zeros')
    self.position = layers.param(rngs, (v.patches, e), (None, 'embed'), 0,
                                 param_dtype)
    self.blocks = Block(cfg, stack=v.num_layers, dtype=param_dtype,
                        rngs=rngs)
    self.final_norm = LayerNorm(e, v.norm_eps, stack=0, dtype=param_dtype,
                                rngs=rngs)
    self.soft_norm = layers.RMSNorm(e, cfg.replace(norm_eps=v.norm_eps),
                                    stack=0, dtype=param_dtype, rngs=rngs)
    self.projection = layers.param(rngs, (e, cfg.embed_dim),
                                   ('mlp', 'embed'), 0, param_dtype,
                                   fan_in=e)

  def encode(self, images: jax.Array) -> jax.Array:
    """The encoder's last hidden states [N, patches, E]."""
    v = self.vision
    n, c, height, width = images.shape
    p = v.patch_size
    if (c, height, width) != (v.channels, v.image_size, v.image_size):
      raise ValueError(f'images of shape {(c, height, width)}, expected '
                       f'{(v.channels, v.image_size, v.image_size)}')
    side = height // p
    patches = images.astype(self.dtype).reshape(n, c, side, p, side, p)
    patches = patches.transpose(0, 2, 4, 1, 3, 5).reshape(n, side * side, -1)
    x = (patches @ self.patch[...].astype(self.dtype) +
         self.patch_bias[...] + self.position[...]).astype(self.dtype)
    graphdef, state = nnx.split(self.blocks)

    def body(x, block_state):
      block_state = jax.tree.map(lambda w: w.astype(self.dtype), block_state)
      return nnx.merge(graphdef, block_state)(x), None
    x, _ = jax.lax.scan(body, x, state)
    return self.final_norm(x)

  def __call__(self, images: jax.Array) -> jax.Array:
    v = self.vision
    x = self.encode(images)
    n, _, e = x.shape
    side, pooled = v.image_size // v.patch_size, round(
        v.tokens_per_image ** 0.5)
    k = side // pooled
    x = x.reshape(n, pooled, k, pooled, k, e).mean(axis=(2, 4))
    x = self.soft_norm(x.reshape(n, pooled * pooled, e))
    return x @ self.projection[...].astype(self.dtype)


def image_blocks(is_image: jax.Array) -> jax.Array:
  """[B, T]: each image's run of tokens numbered 0, 1, ... in its row,
  -1 for text (an image's tokens attend to each other both ways)."""
  starts = is_image & ~jnp.pad(is_image, ((0, 0), (1, 0)))[:, :-1]
  return jnp.where(is_image, jnp.cumsum(starts, axis=1) - 1, -1)


def merge(x: jax.Array, is_image: jax.Array, soft: jax.Array) -> jax.Array:
  """Embeddings x [B, T, D] with each row's image tokens replaced, in
  order, by its images' soft tokens soft [B, images x tokens, D]."""
  index = jnp.clip(jnp.cumsum(is_image, axis=1) - 1, 0, soft.shape[1] - 1)
  picked = jnp.take_along_axis(soft, index[..., None], axis=1)
  return jnp.where(is_image[..., None], picked.astype(x.dtype), x)
