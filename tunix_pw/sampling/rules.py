"""Decoding rules on a batch of logits, and the shape buckets that keep
varying lengths from recompiling."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def bucket(n: int, smallest: int = 16) -> int:
  """The 'pow2_from_16' rule: the next power of two, at least `smallest`."""
  size = smallest
  while size < n:
    size *= 2
  return size


def sample(logits: jax.Array, uniform: jax.Array, temperature: jax.Array,
           top_p: jax.Array, *, top_k: int, use_top_p: bool,
           greedy: bool) -> tuple[jax.Array, jax.Array]:
  """One token per row of logits [B, V] (float32), drawn by inverting the
  row's CDF at `uniform` [B] (in [0, 1)): one random number per row, and no
  sort of the vocabulary; and the log of the probability mass the draw
  kept, of softmax(logits / temperature) (0 untruncated), which is
  KL(truncated || full) of the row.

  top_k (static) keeps the k best; top_p (with use_top_p) keeps the fewest
  most likely tokens whose mass reaches top_p (all tokens tied at the
  boundary); the rest is renormalised. Greedy ignores both."""
  zero = jnp.zeros(logits.shape[:1], jnp.float32)
  if greedy:
    return jnp.argmax(logits, axis=-1), zero
  values, indices, log_kept = logits / temperature, None, zero
  if top_k:
    full = jax.nn.logsumexp(values, axis=-1)
    values, indices = jax.lax.top_k(values, top_k)
    log_kept = jax.nn.logsumexp(values, axis=-1) - full
  probs = jax.nn.softmax(values, axis=-1)
  if use_top_p:
    probs = jnp.where(probs >= nucleus_threshold(probs, top_p)[:, None],
                      probs, 0.0)
  cdf = jnp.cumsum(probs, axis=-1)
  if use_top_p:
    log_kept = log_kept + jnp.log(cdf[:, -1])
  # The first token whose CDF reaches a point in (0, mass]: never a token
  # of probability 0, since its CDF equals its predecessor's.
  point = (1.0 - uniform)[:, None] * cdf[:, -1:]
  choice = jnp.sum(cdf < point, axis=-1)
  if indices is None:
    return choice, log_kept
  return jnp.take_along_axis(indices, choice[:, None], axis=-1)[:, 0], log_kept


def nucleus_threshold(probs: jax.Array, top_p: jax.Array) -> jax.Array:
  """Per row of probs [B, V], the largest t with mass(probs >= t) >= top_p.

  Non-negative float32s order like their bit patterns, so the threshold is
  built bit by bit from the top (31 masked sums, each O(V)): exact, where a
  sort would cost O(V log V) per row."""
  bits = jnp.zeros(probs.shape[:1], jnp.int32)
  for bit in reversed(range(31)):
    candidate = bits | (1 << bit)
    t = jax.lax.bitcast_convert_type(candidate, jnp.float32)
    mass = jnp.sum(jnp.where(probs >= t[:, None], probs, 0.0), axis=-1)
    bits = jnp.where(mass >= top_p, candidate, bits)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)
