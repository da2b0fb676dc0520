"""Distillation strategies (`--config.distill.strategy`): what the teacher
outputs for a batch and how the student's loss compares with it (the math
is in `distill_losses.py`). Each is a registered `Strategy`; the job
(`jobs/distill.py`) asks it and never names one, so adding a strategy
touches this file. Also here: the student's train loss (`distill_loss`)
and the forward pass both sides run.

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
from tunix_pw.runtime.sharding import Sharder
from tunix_pw.train import distill_losses
from tunix_pw.train import step as step_lib

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


def mapped_layers(config: Any, side: int) -> tuple[int, ...]:
  """The student's (side 0) or the teacher's (1) layers that the strategy
  compares (none for one that compares no layers)."""
  if not get(config.distill.strategy).mapped:
    return ()
  return distill_losses.layer_map(config)[side]


def forward(model, batch, layers: tuple[int, ...], shard: Sharder):
  """The logits, and with mapped `layers` their outputs and attention."""
  args = (batch['tokens'], batch['positions'], batch['segment_ids'])
  if not layers:
    return model(*args, shard=shard)[0], None, None
  logits, outputs, probs = model.internals(*args, shard=shard)
  layers = jnp.asarray(layers)
  return logits, outputs[layers], probs[layers]


def distill_loss(model, batch, rng, *, d: Any, student_layers: tuple,
                 shard: Sharder = Sharder(), chunk: int = 0):
  """sft_weight x NLL + weight x the strategy's loss, per target token
  (a strategy's one loss for every token counts once per target token). A
  strategy that reads only logits sees them `chunk` positions at a time
  (`step.model_token_nll`)."""
  del rng
  strategy = get(d.strategy)
  if strategy.mapped:
    logits, outputs, probs = forward(model, batch, student_layers, shard)
    nll, mask, correct = step_lib.token_nll(logits, batch['tokens'],
                                            batch['loss_mask'],
                                            batch['segment_ids'])
    kd_sum = strategy.loss(model, logits, outputs, probs, batch,
                           d) * mask.sum()
  else:
    teacher = {k: v for k, v in batch.items() if k.startswith('teacher_')}
    nll, mask, correct, kd = step_lib.model_token_nll(
        model, batch['tokens'], batch['positions'], batch['segment_ids'],
        batch['loss_mask'], shard, chunk, also=(
            lambda logits, part: strategy.loss(model, logits, None, None,
                                               part, d), teacher))
    kd_sum = (kd * mask).sum()
  return d.sft_weight * (nll * mask).sum() + d.weight * kd_sum, dict(
      weight=mask.sum(), accuracy=(correct * mask).sum(),
      nll=(nll * mask).sum(), kd=kd_sum)
