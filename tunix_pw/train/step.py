"""The train step: gradient accumulation over micro batches, then one
optimizer update, jitted with the state donated.

A loss function returns sums over its micro batch (the loss summed over
tokens or examples, plus metric sums) and the count it normalises by
('weight': target tokens for token losses, examples for preference losses).
The step divides the accumulated sums by the total weight of the whole
batch, so 4 micro batches with unequal token counts give exactly the update
of one full batch.
"""

from __future__ import annotations

from collections.abc import Callable
import functools
from typing import Any

import flax
from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
import optax

from tunix_pw.runtime.sharding import Sharder

LossFn = Callable[[Any, dict[str, jax.Array], jax.Array],
                  tuple[jax.Array, dict[str, jax.Array]]]


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar
  params: Any  # the trainable parameters (an nnx.State)
  opt_state: Any
  rng: jax.Array  # uint32 key data
  nonfinite: jax.Array  # int32: consecutive steps skipped as non-finite

  @classmethod
  def create(cls, params, optimizer: optax.GradientTransformation,
             seed: int) -> 'TrainState':
    state = cls(jnp.int32(0), params, optimizer.init(params),
                jax.random.key_data(jax.random.key(seed)), jnp.int32(0))
    # Scalars (step, RNG, optimizer counts) replicated on the parameters'
    # mesh: committed like the rest, so a restored state fits the step.
    first = jax.tree.leaves(params)[0].sharding
    if not isinstance(first, NamedSharding):
      return state
    replicated = NamedSharding(first.mesh, PartitionSpec())
    return jax.tree.map(
        lambda x: x if isinstance(x.sharding, NamedSharding)
        else jax.device_put(x, replicated), state)


  @classmethod
  def abstract(cls, params, optimizer: optax.GradientTransformation
               ) -> 'TrainState':
    """The state `create` makes, as ShapeDtypeStructs with its shardings,
    from parameters given as such: for ahead-of-time compiles. Optimizer
    slots are sharded like their parameters, scalars replicated."""
    mesh = jax.tree.leaves(params)[0].sharding.mesh
    replicated = NamedSharding(mesh, PartitionSpec())

    def like(shape, sharding):
      return jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=sharding)

    opt_state = optax.tree_utils.tree_map_params(
        optimizer, lambda s, p: like(s, p.sharding),
        jax.eval_shape(optimizer.init, params), params,
        transform_non_params=lambda s: like(s, replicated))
    scalars = jax.eval_shape(lambda: (
        jnp.int32(0), jax.random.key_data(jax.random.key(0))))
    return cls(like(scalars[0], replicated), params, opt_state,
               like(scalars[1], replicated), like(scalars[0], replicated))


def micro_batches(batch: dict[str, jax.Array], count: int) -> dict[str, Any]:
  """[B, ...] -> [count, B // count, ...], micro batch m taking rows m,
  m + count, ...: each micro batch stays spread over every data shard."""
  def split(x):
    rows = x.shape[0]
    if rows % count:
      raise ValueError(f'{rows} rows do not split into {count} micro batches')
    return x.reshape((rows // count, count) + x.shape[1:]).swapaxes(0, 1)
  return jax.tree.map(split, batch)


def token_nll(logits: jax.Array, tokens: jax.Array, loss_mask: jax.Array,
              segment_ids: jax.Array) -> tuple[jax.Array, ...]:
  """Next-token negative log-likelihood on masked targets, per position
  [B, T-1]; a target counts when it is masked in and in the same segment as
  its predecessor (packed rows). Returns (nll, weight, correct)."""
  nll, correct = _nll(logits[:, :-1], tokens[:, 1:])
  return nll, _target_weight(loss_mask, segment_ids), correct


def _nll(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, ...]:
  """-log p(targets) and whether each is the most likely token, per
  position."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  return nll, (jnp.argmax(logp, axis=-1) == targets).astype(jnp.float32)


def _target_weight(loss_mask: jax.Array, segment_ids: jax.Array) -> jax.Array:
  return (loss_mask[:, 1:] * (segment_ids[:, 1:] == segment_ids[:, :-1]) *
          (segment_ids[:, 1:] > 0)).astype(jnp.float32)


# Positions per chunk of the vocabulary's logits, by default: about 128 MiB
# of float32 logits per batch row (262,144 entries: 128 positions), and the
# whole sequence at once for small vocabularies.
CHUNK_BYTES = 2**27


def chunk_size(vocab: int, chunk: int = 0) -> int:
  """A config's `logits_chunk`, or (0) the default for `vocab` entries."""
  return chunk or max(16, CHUNK_BYTES // (4 * vocab))


def by_chunks(model, x: jax.Array, inputs: Any,
              reduce: Callable[[jax.Array, Any], Any],
              step: int, shard: Sharder = Sharder()) -> Any:
  """`reduce(logits [B, c, V], inputs at those positions)` -> a tree of
  arrays [B, c, ...], over the final hidden states x [B, T, D] `step`
  positions at a time, joined to [B, T, ...]; `inputs` (a tree of arrays
  [B, T, ...]) are cut into the same chunks. The LM head's logits exist one
  chunk at a time, and are recomputed chunk by chunk in the backward pass
  (`jax.checkpoint`), so gradients are exact and [B, T, V] never exists
  whole."""
  n, t, _ = x.shape
  pad = -t % step

  def cut(a):  # [B, T, ...] -> [chunks, B, step, ...]
    a = jnp.pad(a, ((0, 0), (0, pad)) + ((0, 0),) * (a.ndim - 2))
    return a.reshape((n, -1, step) + a.shape[2:]).swapaxes(0, 1)

  def join(a):  # [chunks, B, step, ...] -> [B, T, ...]
    return a.swapaxes(0, 1).reshape((n, -1) + a.shape[3:])[:, :t]

  @jax.checkpoint
  def one(piece):
    return reduce(model.logits(piece[0], shard), piece[1])

  return jax.tree.map(join, jax.lax.map(one, (cut(x), jax.tree.map(cut,
                                                                    inputs))))


def next_token_stats(model, tokens: jax.Array, positions: jax.Array,
                     segment_ids: jax.Array,
                     reduce: Callable[[jax.Array, jax.Array], Any], *,
                     shard: Sharder = Sharder(), chunk: int = 0,
                     also: tuple[Callable[..., Any], Any] | None = None,
                     images: jax.Array | None = None) -> tuple[Any, ...]:
  """`reduce(logits [B, c, V], next tokens [B, c])` -> a tuple of arrays
  [B, c, ...], over the model's logits for tokens [B, T] `chunk` positions
  at a time (`chunk_size`; a sequence that fits one chunk takes them
  whole), joined to [B, T, ...]. Position t's target is token t+1; the
  last position's wraps round to the first token, so callers drop it.
  `also` (fn, inputs): fn(logits, inputs at the same positions) -> a tree
  of arrays, appended to reduce's outputs. `images`: each row's (a
  vision-language model's)."""
  x, _ = model.hidden(tokens, positions, segment_ids, shard=shard,
                      images=images)

  def reduce_also(logits, pieces):
    targets, inputs = pieces
    return (*reduce(logits, targets),
            *((also[0](logits, inputs),) if also else ()))

  # All T positions, cut to T-1 by callers once reduced: a slice of the
  # sharded logits trips the TPU compiler (libtpu 0.0.42).
  pieces = (jnp.roll(tokens, -1, axis=1), also and also[1])
  step = chunk_size(model.cfg.vocab_size, chunk)
  if step >= x.shape[1]:
    return reduce_also(model.logits(x, shard), pieces)
  return by_chunks(model, x, pieces, reduce_also, step, shard)


def model_token_nll(model, tokens: jax.Array, positions: jax.Array,
                    segment_ids: jax.Array, loss_mask: jax.Array,
                    shard: Sharder = Sharder(), chunk: int = 0,
                    also: tuple[Callable[..., jax.Array], Any] | None = None,
                    images: jax.Array | None = None
                    ) -> tuple[jax.Array, ...]:
  """`token_nll` of the model's logits, `chunk` positions of them at a time
  (`next_token_stats`). `also` (fn, inputs): fn(logits [B, c, V], inputs
  at the same positions) -> [B, c], computed on the same logits and
  returned last, [B, T-1]."""
  nll, correct, *more = next_token_stats(
      model, tokens, positions, segment_ids, _nll, shard=shard, chunk=chunk,
      also=also, images=images)
  return (nll[:, :-1], _target_weight(loss_mask, segment_ids),
          correct[:, :-1], *(m[:, :-1] for m in more))


def make_step(graphdef: nnx.GraphDef, frozen: Any, loss_fn: LossFn,
              optimizer: optax.GradientTransformation, schedule: Callable,
              num_micro_batches: int, state_shardings: Any = None):
  """`step(state, batch) -> (state, metrics)`, jitted.

  `loss_fn(model, micro_batch, rng) -> (loss_sum, sums)` sees the model
  merged from the trainable params and `frozen` (the rest of the state, e.g.
  a LoRA base; split in that order); `sums` must hold 'weight'. `frozen` is
  an argument of the jitted function (`.func`), never a closure: XLA would
  embed a closed-over base as constants. Its shapes suffice for
  `step.func.lower(state, batch, frozen=...)`.

  `state_shardings` (a TrainState of the state's shardings): gradients are
  kept in its parameters' and the new state is laid out as the old one.
  Unconstrained, XLA may give the gradient buffers of scanned layers no
  sharding (a whole model's gradients on every device under FSDP), and
  the new state an equal layout spelled otherwise, which makes the next
  step and the weight sync compile again.

  A step whose loss or gradient norm is not finite changes neither the
  parameters nor the optimizer state: metrics `skipped` (1) and
  `nonfinite_streak` (such steps in a row) say so."""

  def constrain(tree, part=lambda s: s):
    if state_shardings is None:
      return tree
    return jax.lax.with_sharding_constraint(tree, part(state_shardings))

  def compute(params, frozen, batch, rng):
    state = (params,) if frozen is None else (params, frozen)
    return loss_fn(nnx.merge(graphdef, *state), batch, rng)

  def step(state: TrainState, batch: dict[str, jax.Array], frozen: Any):
    rng = jax.random.wrap_key_data(state.rng)
    rng, step_rng = jax.random.split(rng)
    grads, loss, sums = _summed_over_micro_batches(
        compute, lambda g: constrain(g, lambda s: s.params), state.params,
        frozen, batch, step_rng, num_micro_batches)
    weight = jnp.maximum(sums['weight'], 1.0)
    grads = jax.tree.map(lambda g: g / weight, grads)
    updates, opt_state = optimizer.update(grads, state.opt_state,
                                          state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep = lambda new, old: jax.tree.map(
        lambda a, b: jnp.where(finite, a, b), new, old)
    metrics = {k: v / weight for k, v in sums.items() if k != 'weight'}
    nonfinite = jnp.where(finite, 0, state.nonfinite + 1)
    metrics.update(loss=loss / weight, weight=sums['weight'],
                   grad_norm=grad_norm, learning_rate=schedule(state.step),
                   skipped=1.0 - finite.astype(jnp.float32),
                   nonfinite_streak=nonfinite.astype(jnp.float32))
    new = TrainState(state.step + 1, keep(params, state.params),
                     keep(opt_state, state.opt_state),
                     jax.random.key_data(rng), nonfinite)
    return constrain(new), metrics

  return functools.partial(jax.jit(step, donate_argnums=0), frozen=frozen)


def _summed_over_micro_batches(compute, constrain, params, frozen, batch, rng,
                               num_micro_batches: int):
  """The gradients of `compute(params, frozen, batch, rng) -> (loss, sums)`
  with its loss and sums, each summed over the micro batches of `batch` (one
  scan step each); gradients kept in `constrain`'s shardings."""
  grad_fn = jax.value_and_grad(compute, has_aux=True)
  micro = micro_batches(batch, num_micro_batches)
  keys = jax.random.split(rng, num_micro_batches)

  def accumulate(carry, xs):
    grads, loss, sums = carry
    mb, key = xs
    (mb_loss, mb_sums), mb_grads = grad_fn(params, frozen, mb, key)
    return (jax.tree.map(jnp.add, grads, constrain(mb_grads)),
            loss + mb_loss,
            jax.tree.map(jnp.add, sums, mb_sums)), None

  zero_grads = constrain(jax.tree.map(jnp.zeros_like, params))
  first_sums = jax.eval_shape(compute, params, frozen,
                              jax.tree.map(lambda x: x[0], micro), keys[0])[1]
  zero_sums = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), first_sums)
  return jax.lax.scan(accumulate, (zero_grads, jnp.float32(0), zero_sums),
                      (micro, keys))[0]
