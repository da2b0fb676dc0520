"""Distillation strategies (`--config.distill.strategy`): what the teacher
outputs for a batch and how the student's loss compares with it (the math
is in `distill_losses.py`). Each is a registered `Strategy`; the job
(`jobs/distill.py`) asks it and never names one, so adding a strategy
touches this file.

- logit: a divergence between next-token distributions, the teacher's
  logits whole or its top-k;
- attention: the attention maps of the mapped layers (`distill.layers`);
- feature: the outputs of the mapped layers, the student's through a
  learned projection to the teacher's width, each side RMS-normed.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tunix_pw import registry
from tunix_pw.train import distill_losses

Shapes = dict[str, tuple[tuple[int, ...], Any]]


@dataclasses.dataclass(frozen=True)
class Strategy:
  """teacher: (its logits, its layer outputs and attention at the mapped
    layers (None unless `mapped`), the `distill` block) -> its outputs for
    the batch, batch first.
  loss: (the student model, its logits, its outputs and attention at the
    mapped layers, the batch with the teacher's outputs, the block) ->
    one loss for every token (a scalar), or, for a strategy that reads
    only logits (not `mapped`), each position's [B, T] (the last is
    dropped: it has no target), which it may get a chunk of positions at
    a time (the teacher's outputs cut alike).
  shapes: (the block, rows, length, the teacher's architecture, the mapped
    layers' count) -> the teacher's outputs as (shape, dtype).
  mapped: compares the layers `distill.layers` maps (the models then run
    with their internals, `Decoder.internals`).
  projection: trains a projection of the student's mapped outputs to the
    teacher's width (`distill_losses.attach_projection`)."""

  teacher: Callable[..., dict[str, jax.Array]]
  loss: Callable[..., jax.Array]
  shapes: Callable[[Any, int, int, Any, int], Shapes]
  mapped: bool = True
  projection: bool = False


def get(name: str) -> Strategy:
  return registry.get('distill_strategy', name)


def rms_normed(x: jax.Array) -> jax.Array:
  """Scale-free features: each position's vector over its RMS."""
  return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)


def _real(batch: dict[str, jax.Array]) -> jax.Array:
  return (batch['segment_ids'] > 0).astype(jnp.float32)


def _per_layer(compare: Callable[..., jax.Array], student: jax.Array,
               teacher: jax.Array, batch: dict[str, jax.Array]) -> jax.Array:
  """`compare` per mapped layer (the student's [layers, B, ...], the
  teacher's [B, layers, ...]), averaged over them."""
  return jax.vmap(compare, in_axes=(0, 1, None))(student, teacher,
                                                 _real(batch)).mean()


def _logit_shapes(d, rows, length, teacher, layers) -> Shapes:
  del layers
  width = d.top_k or teacher.vocab_size
  return {'teacher_logits': ((rows, length, width), np.float32),
          **({'teacher_indices': ((rows, length, width), np.int32)}
             if d.top_k else {})}


registry.register('distill_strategy', 'logit')(Strategy(
    teacher=lambda logits, outputs, probs, d: (
        distill_losses.teacher_outputs(logits, d.top_k)),
    loss=lambda model, logits, outputs, probs, batch, d: (
        distill_losses.logit_divergence(logits, batch, d)),
    shapes=_logit_shapes, mapped=False))

registry.register('distill_strategy', 'attention')(Strategy(
    teacher=lambda logits, outputs, probs, d: {
        'teacher_attention': jnp.moveaxis(probs, 0, 1)},
    loss=lambda model, logits, outputs, probs, batch, d: _per_layer(
        distill_losses.attention_transfer, probs,
        batch['teacher_attention'], batch),
    shapes=lambda d, rows, length, teacher, layers: {
        'teacher_attention': ((rows, layers, teacher.num_heads, length,
                               length), np.float32)}))


def _feature_loss(model, logits, outputs, probs, batch, d) -> jax.Array:
  del logits, probs
  projected = jnp.einsum('mbts,msd->mbtd', outputs,
                         model.distill_projection[...])
  return _per_layer(functools.partial(distill_losses.feature,
                                      pooling=d.pooling),
                    rms_normed(projected), rms_normed(batch['teacher_hidden']),
                    batch)


registry.register('distill_strategy', 'feature')(Strategy(
    teacher=lambda logits, outputs, probs, d: {
        'teacher_hidden': jnp.moveaxis(outputs, 0, 1)},
    loss=_feature_loss,
    shapes=lambda d, rows, length, teacher, layers: {
        'teacher_hidden': ((rows, layers, length, teacher.embed_dim),
                           np.float32)},
    projection=True))
