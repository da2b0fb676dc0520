"""Distillation losses, per token, as pure functions of logits.

The teacher's logits come whole ([..., V]) or as its top-k (values and
token indices, [..., k]); with top-k, both distributions are renormalised
over the teacher's k tokens (the student's logits gathered there), so every
divergence below stays finite and only k numbers per token cross meshes.
Logits are divided by the temperature tau first; the losses are scaled by
tau^2 so that their gradients keep their size as tau changes (Hinton et
al. 2015, arXiv 1503.02531).

- forward KL(p_T || p_S) (Hinton et al. 2015): the student covers the
  teacher's modes;
- reverse KL(p_S || p_T) (Gu et al. 2024, MiniLLM, arXiv 2306.08543): the
  student seeks one mode;
- generalised JSD(beta) (Agarwal et al. 2024, GKD, arXiv 2306.13649, eq. 2):
  beta KL(p_T || m) + (1 - beta) KL(p_S || m), m = beta p_T +
  (1 - beta) p_S; beta -> 0 and 1 approach the two KLs (scaled by beta).

Attention and feature distillation pair layers (`layer_map`); feature
distillation trains a projection of the student's layer outputs to the
teacher's width with the student (`attach_projection`).
"""

from __future__ import annotations

from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from tunix_pw import registry
from tunix_pw.errors import UsageError
from tunix_pw.models import blocks, lora
from tunix_pw.registry import register


def top_k(teacher_logits: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """The teacher's k largest logits and their token ids, [..., k]."""
  return jax.lax.top_k(teacher_logits.astype(jnp.float32), k)


def teacher_outputs(logits: jax.Array, k: int) -> dict[str, jax.Array]:
  """What crosses to the student's mesh: the teacher's logits, whole or its
  top-k (`teacher_logits`, with `teacher_indices` then)."""
  if not k:
    return dict(teacher_logits=logits)
  values, indices = top_k(logits, k)
  return dict(teacher_logits=values, teacher_indices=indices)


TEACHER_LOGITS = ('teacher_logits', 'teacher_indices')


def logit_divergence(student_logits: jax.Array,
                     teacher: dict[str, jax.Array], d: Any) -> jax.Array:
  """tau^2 x the divergence `d.divergence` of the student's and the
  teacher's next-token distributions at each position [B, T], against the
  teacher's outputs (`teacher_outputs`) at the same positions."""
  log_s, log_t = log_probs(student_logits, teacher['teacher_logits'],
                           teacher.get('teacher_indices'), d.temperature)
  return d.temperature ** 2 * registry.get('distill_divergence',
                                           d.divergence)(log_s, log_t, d.beta)


def log_probs(student_logits: jax.Array, teacher: jax.Array,
              indices: jax.Array | None, tau: float
              ) -> tuple[jax.Array, jax.Array]:
  """(log p_S, log p_T) at temperature tau, over the vocabulary or over
  the teacher's top-k tokens (`indices`)."""
  student = student_logits.astype(jnp.float32)
  if indices is not None:
    student = jnp.take_along_axis(student, indices, axis=-1)
  return (jax.nn.log_softmax(student / tau),
          jax.nn.log_softmax(teacher.astype(jnp.float32) / tau))


def _kl(log_p: jax.Array, log_q: jax.Array) -> jax.Array:
  return (jnp.exp(log_p) * (log_p - log_q)).sum(-1)


@register('distill_divergence', 'forward_kl')
def forward_kl(log_s: jax.Array, log_t: jax.Array, beta: float) -> jax.Array:
  del beta
  return _kl(log_t, log_s)


@register('distill_divergence', 'reverse_kl')
def reverse_kl(log_s: jax.Array, log_t: jax.Array, beta: float) -> jax.Array:
  del beta
  return _kl(log_s, log_t)


@register('distill_divergence', 'jsd')
def jsd(log_s: jax.Array, log_t: jax.Array, beta: float) -> jax.Array:
  log_m = jnp.logaddexp(jnp.log(beta) + log_t, jnp.log1p(-beta) + log_s)
  return beta * _kl(log_t, log_m) + (1.0 - beta) * _kl(log_s, log_m)


def attention_transfer(student: jax.Array, teacher: jax.Array,
                       real: jax.Array) -> jax.Array:
  """The mean over real query positions (`real` [B, T]) of the squared
  difference of two attention maps [B, heads, T, S], summed over keys and
  averaged over heads; each side's heads averaged first when their counts
  differ. Attention transfer (Zagoruyko & Komodakis 2017, arXiv
  1612.03928) on attention probabilities, as in MiniLM (Wang et al. 2020,
  arXiv 2002.10957, which uses a KL instead)."""
  if student.shape[1] != teacher.shape[1]:
    student, teacher = (x.mean(1, keepdims=True) for x in (student, teacher))
  per_query = ((student - teacher) ** 2).sum(-1).mean(1)
  return (per_query * real).sum() / jnp.maximum(real.sum(), 1)


def feature(student: jax.Array, teacher: jax.Array, real: jax.Array, *,
            pooling: str) -> jax.Array:
  """The mean squared error between (projected) student features and the
  teacher's [B, T, D] (FitNets, Romero et al. 2015, arXiv 1412.6550):
  `pooling='token'` per real position (`real` [B, T]) averaged over them;
  'mean' between each sequence's mean-pooled features, averaged over the
  sequences."""
  if pooling == 'mean':
    count = jnp.maximum(real.sum(-1, keepdims=True), 1)
    student, teacher = ((x * real[..., None]).sum(1) / count
                        for x in (student, teacher))
    has = (real.sum(-1) > 0).astype(jnp.float32)
    return (((student - teacher) ** 2).mean(-1) * has).sum() / jnp.maximum(
        has.sum(), 1)
  per_position = ((student - teacher) ** 2).mean(-1)
  return (per_position * real).sum() / jnp.maximum(real.sum(), 1)


def layer_map(config: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(student layers, teacher layers) of `distill.layers` ('0:1,3:5'); by
  default each student layer with the teacher's at the same relative depth
  (the last with the last)."""
  sizes = [blocks.architecture(b).num_layers for b in (config.model,
                                                      config.teacher)]
  spec = config.distill.layers
  try:
    pairs = ([tuple(int(i) for i in p.split(':')) for p in spec.split(',')]
             if spec else [(i, round((i + 1) * sizes[1] / sizes[0]) - 1)
                           for i in range(sizes[0])])
    if any(len(p) != 2 for p in pairs):
      raise ValueError
  except ValueError:
    raise UsageError(f'--config.distill.layers={spec!r} must be student:'
                     "teacher layer pairs, e.g. '0:1,3:5'.") from None
  for (s, t) in pairs:
    if not (0 <= s < sizes[0] and 0 <= t < sizes[1]):
      raise UsageError(f'--config.distill.layers pairs student layer {s} '
                       f'with teacher layer {t}, but the student has '
                       f'{sizes[0]} layers and the teacher {sizes[1]}.')
  return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


class DistillProjection(lora.LoRAParam):
  """Trained with the student, adapters or not; never exported."""


def attach_projection(model: nnx.Module, config: Any) -> None:
  """Feature distillation's learned projection of the mapped student
  layers' outputs to the teacher's width, [mapped, D_student, D_teacher],
  starting at the identity's corner (`setup.attach` adds it,
  `setup.detach_projection` drops it)."""
  student, _ = layer_map(config)
  d_s, d_t = (blocks.architecture(b).embed_dim for b in (config.model,
                                                        config.teacher))
  model.distill_projection = DistillProjection(
      jnp.broadcast_to(jnp.eye(d_s, d_t), (len(student), d_s, d_t)),
      axes=(None, 'embed', None))
