"""LoRA and QLoRA, own and small: adapters on chosen projections by regex.

An adapted weight W (attention q [D, N, H], MLP down [F, D], ..., stacked
over scanned layers) gains factors A [in..., r] and B [r, out...] carrying
the base's own logical axes, so adapters shard like their base; layers read
W + (alpha / r) * A @ B, formed per layer inside the scan (a transient the
size of one layer's weight). QLoRA keeps the frozen base as int8 with one
scale per output channel, dequantised at the same point.

Why not qwix: our layers reshape weights into 2-D matmuls (XLA's fastest
path), which qwix's einsum interception would not see; adding the delta where
a layer reads its weight keeps every layer, scan and sharding rule as it is.
Only `LoRAParam`s train; `merge` folds them into the base for export.
"""

from __future__ import annotations

import math
import re

from flax import nnx
import jax
import jax.numpy as jnp

from tunix_pw.errors import UsageError

# Adaptable weights: (dims contracted with the input, output dims), without
# the stack dim scanned layers add in front.
SHAPES = {'q': (1, 2), 'k': (1, 2), 'v': (1, 2), 'o': (2, 1),
          'gate': (1, 1), 'up': (1, 1), 'down': (1, 1)}


class LoRAParam(nnx.Param):
  """An adapter factor: the only parameters a LoRA run trains."""


class QuantizedBase(nnx.Variable):
  """A frozen int8 base weight, or its per-output-channel scale."""


def weight(module: nnx.Module, name: str) -> jax.Array:
  """A layer's weight as it computes with it: dequantised when stored as
  int8, plus its LoRA delta when adapted."""
  value = getattr(module, name)[...]
  scale = getattr(module, f'{name}_scale', None)
  if scale is not None:
    value = value.astype(scale.dtype) * scale[...]
  a = getattr(module, f'{name}_lora_a', None)
  if a is not None:
    b = getattr(module, f'{name}_lora_b')[...]
    in_dims, _ = SHAPES[name]
    a = a[...]
    lead = a.shape[:a.ndim - in_dims - 1]  # the stack dim, when present
    delta = jnp.einsum('...ir,...ro->...io',
                       a.reshape(lead + (-1, a.shape[-1])),
                       b.reshape(lead + (b.shape[len(lead)], -1)))
    value = value + (module.lora_scale * delta).reshape(value.shape).astype(
        value.dtype)
  return value


def apply(model: nnx.Module, targets: str, rank: int, alpha: float,
          seed: int = 0, quantize: str = '') -> list[str]:
  """Adds adapters to each weight whose path matches `targets` (a regex over
  paths like 'groups/0/1/attn/q'); quantize='int8' stores the frozen base as
  int8 (QLoRA). B starts at zero, so the model's output is unchanged.
  Returns the adapted paths."""
  if quantize not in ('', 'int8'):
    raise UsageError(f"--config.lora.quantize={quantize!r} must be '' or "
                     "'int8'.")
  pattern = re.compile(targets)
  rngs = nnx.Rngs(seed)
  adapted = []
  for path, module in list(nnx.iter_modules(model)):
    for name, (in_dims, out_dims) in SHAPES.items():
      base = getattr(module, name, None)
      full = '/'.join(map(str, path + (name,)))
      if not isinstance(base, nnx.Param) or not pattern.fullmatch(full):
        continue
      value, axes = base[...], base.get_metadata()['axes']
      stack = value.ndim - in_dims - out_dims
      lead, lead_axes = value.shape[:stack], axes[:stack]
      ins = value.shape[stack:stack + in_dims]
      outs = value.shape[stack + in_dims:]
      a = jax.random.normal(rngs.params(), lead + ins + (rank,),
                            jnp.float32) / math.sqrt(math.prod(ins))
      setattr(module, f'{name}_lora_a', LoRAParam(
          a.astype(value.dtype),
          axes=lead_axes + axes[stack:stack + in_dims] + (None,)))
      setattr(module, f'{name}_lora_b', LoRAParam(
          jnp.zeros(lead + (rank,) + outs, value.dtype),
          axes=lead_axes + (None,) + axes[stack + in_dims:]))
      module.lora_scale = alpha / rank
      if quantize:
        channels = tuple(range(stack, stack + in_dims))
        scale = jnp.max(jnp.abs(value.astype(jnp.float32)), axis=channels,
                        keepdims=True) / 127.0
        scale = jnp.where(scale == 0, 1.0, scale)
        setattr(module, name, QuantizedBase(
            jnp.round(value / scale).astype(jnp.int8), axes=axes))
        setattr(module, f'{name}_scale', QuantizedBase(scale, axes=tuple(
            None if i in channels else a for i, a in enumerate(axes))))
      adapted.append(full)
  if not adapted:
    raise UsageError(f'--config.lora.targets={targets!r} matches no weight; '
                     "paths look like 'groups/0/0/attn/q' or "
                     "'groups/0/0/mlp/down'.")
  return adapted


def merge(model: nnx.Module) -> None:
  """Folds every adapter (and dequantises every int8 base) into a plain
  weight, in place: the model is an ordinary one again, for export."""
  for _, module in list(nnx.iter_modules(model)):
    for name in SHAPES:
      if not (hasattr(module, f'{name}_lora_a') or
              hasattr(module, f'{name}_scale')):
        continue
      axes = getattr(module, name).get_metadata()['axes']
      # In the base's dtype, which its adapters keep (an int8 base
      # dequantises through float32 scales).
      merged = weight(module, name).astype(
          getattr(module, f'{name}_lora_a')[...].dtype)
      for suffix in ('_lora_a', '_lora_b', '_scale'):
        if hasattr(module, name + suffix):
          delattr(module, name + suffix)
      setattr(module, name, nnx.Param(merged, axes=axes))
