"""Decoding rules on a batch of logits, and the shape buckets that keep
varying lengths from recompiling."""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30


def bucket(n: int, smallest: int = 16) -> int:
  """The 'pow2_from_16' rule: the next power of two, at least `smallest`."""
  size = smallest
  while size < n:
    size *= 2
  return size


def sample(logits: jax.Array, key: jax.Array, temperature: jax.Array,
           top_p: jax.Array, *, top_k: int, use_top_p: bool,
           greedy: bool) -> jax.Array:
  """One token per row of logits [B, V] (float32).

  top_k (static) keeps the k best; top_p (with use_top_p) keeps the smallest
  prefix of the sorted distribution whose mass reaches top_p; the rest is
  renormalised. Greedy ignores both."""
  if greedy:
    return jnp.argmax(logits, axis=-1)
  logits = logits / temperature
  if not top_k and not use_top_p:
    return jax.random.categorical(key, logits, axis=-1)
  if top_k:
    values, indices = jax.lax.top_k(logits, top_k)
  else:  # the whole vocabulary, best first
    indices = jnp.argsort(-logits, axis=-1)
    values = jnp.take_along_axis(logits, indices, axis=-1)
  if use_top_p:
    probs = jax.nn.softmax(values, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of better tokens
    values = jnp.where(before < top_p, values, NEG_INF)
  choice = jax.random.categorical(key, values, axis=-1)
  return jnp.take_along_axis(indices, choice[:, None], axis=-1)[:, 0]
