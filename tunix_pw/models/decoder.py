"""The decoder: embeddings, scan-stacked layer groups, final norm, logits.

Layers are grouped by their repeating attention pattern (config.groups):
Llama/Qwen/Gemma 1 scan single layers, Gemma 2 blocks of (local, global),
Gemma 3 blocks of 5 local + 1 global plus a block of the remainder. Each
pattern position's parameters are stacked over the group's repeats, and one
jax.lax.scan runs the group (or a Python loop when scan is off); on a mesh
with a `stage` axis, a pipeline over the group's repeats.

One call serves training (no cache: the sequence attends to itself, with
segment ids for packed sequences) and sampling (a KV cache: this call's keys
and values are written at `cache_slot`, then the queries attend to the
cache). Masks come from slots (causality), segment ids (padding, packing)
and positions (sliding windows), so left-padded rows are exact.
"""

from __future__ import annotations

import operator
from typing import Any

import flax
from flax import nnx
import jax
import jax.numpy as jnp

from tunix_pw.errors import UsageError
from tunix_pw.models import layers, vision
from tunix_pw.models.config import GLOBAL, LOCAL, ModelConfig
from tunix_pw.runtime.sharding import Sharder

# Per group, per repeat: that layer block's parameters (`split_layers`).
Layers = tuple[tuple[nnx.State, ...], ...]

REMAT_POLICIES = {
    'none': None,
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


@flax.struct.dataclass
class Cache:
  """Keys/values per group and pattern position ([repeats, B, K, S, H], or
  after `per_layer` a tuple of each repeat's), and per slot the token
  position and segment (0: empty or padding)."""

  k: tuple[tuple[Any, ...], ...]
  v: tuple[tuple[Any, ...], ...]
  positions: jax.Array  # [B, S]
  segments: jax.Array  # [B, S]

  @classmethod
  def empty(cls, cfg: ModelConfig, batch: int, size: int,
            dtype=jnp.float32) -> 'Cache':
    def kv():
      return tuple(
          tuple(jnp.zeros((repeats, batch, cfg.num_kv_heads, size,
                           cfg.head_dim), dtype) for _ in pattern)
          for pattern, repeats in cfg.groups)
    return cls(kv(), kv(), jnp.zeros((batch, size), jnp.int32),
               jnp.zeros((batch, size), jnp.int32))

  @property
  def size(self) -> int:
    return self.positions.shape[1]

  def per_layer(self) -> 'Cache':
    """Each layer's keys and values in buffers of their own, for a decode
    loop over `Decoder.split_layers`: each layer then attends to its
    buffers in place, where XLA:CPU copies a layer's slice of the stacked
    ones out at every decode step. The buffers drop a batch or head axis
    of size 1: XLA's dots read them so, and a write into a buffer read
    through that reshape costs two copies of it per step (a fifth of a
    one-row decode step of a small model). Keys are stored
    transposed ([B, K, H, S]): XLA:CPU's batched query-key matmul takes
    half the time on them."""
    def split(stacks, layout=lambda x: x):
      return tuple(tuple(tuple(layout(_squeeze_ones(x)) for x in stack)
                         for stack in group) for group in stacks)
    return self.replace(k=split(self.k, lambda x: jnp.swapaxes(x, -1, -2)),
                        v=split(self.v))

  def take(self, rows: jax.Array) -> 'Cache':
    """Rows `rows` of this cache, in that order (a tree rollout's forks
    copy their parent's keys and values). A stacked buffer's batch axis is
    its second ([repeats, B, ...]), a per-layer buffer's its first."""
    pick = lambda a: jnp.take(a, rows, axis=1 if a.ndim == 5 else 0)
    return Cache(jax.tree.map(pick, self.k), jax.tree.map(pick, self.v),
                 self.positions[rows], self.segments[rows])

  def repeat(self, n: int) -> 'Cache':
    """Each row `n` times in a row (one prefill for n generations)."""
    rows = lambda axis: lambda a: jnp.repeat(a, n, axis=axis)
    return Cache(jax.tree.map(rows(1), self.k), jax.tree.map(rows(1), self.v),
                 rows(0)(self.positions), rows(0)(self.segments))


def _squeeze_ones(x: jax.Array) -> jax.Array:
  """One layer's [B, K, S, H] without its batch and head axes of size 1."""
  return x.reshape(tuple(n for n in x.shape[:2] if n > 1) + x.shape[2:])


def attention_masks(cfg: ModelConfig, q_positions, q_segments, q_slots,
                    kv_positions, kv_segments, kv_slots, q_blocks=None,
                    kv_blocks=None) -> dict[str, Any]:
  """[B, T, S] masks per attention type (True = attend). With image
  blocks (`vision.image_blocks`), an image's tokens also attend to each
  other both ways."""
  same = ((q_segments[:, :, None] == kv_segments[:, None, :]) &
          (kv_segments[:, None, :] > 0))
  causal = kv_slots[:, None, :] <= q_slots[:, :, None]
  masks = {GLOBAL: causal}
  if LOCAL in cfg.layer_types:
    distance = q_positions[:, :, None] - kv_positions[:, None, :]
    masks[LOCAL] = causal & (distance < cfg.sliding_window)
  if q_blocks is not None:
    image = ((q_blocks[:, :, None] == kv_blocks[:, None, :]) &
             (q_blocks[:, :, None] >= 0))
    masks = {t: m | image for t, m in masks.items()}
  return {t: same & m for t, m in masks.items()}


class Layer(nnx.Module):
  """One decoder layer (pre-norms; Gemma 2/3 add post-norms)."""

  def __init__(self, cfg: ModelConfig, layer_type: str, *, stack: int,
               dtype, rngs: nnx.Rngs):
    self.layer_type = layer_type
    d = cfg.embed_dim
    norm = lambda: layers.RMSNorm(d, cfg, stack=stack, dtype=dtype, rngs=rngs)
    self.pre_attn_norm = norm()
    self.attn = layers.Attention(cfg, stack=stack, dtype=dtype, rngs=rngs)
    self.pre_mlp_norm = norm()
    self.mlp = layers.MLP(cfg, stack=stack, dtype=dtype, rngs=rngs)
    self.post_norms = cfg.post_norms
    if cfg.post_norms:
      self.post_attn_norm = norm()
      self.post_mlp_norm = norm()

  def __call__(self, x, rotations, masks, cache, index, slot,
               shard: Sharder, collect: bool = False):
    """`cache`: this pattern position's stacked (keys, values), each
    [repeats, B, K, S, H], or None; this layer's keys and values are written
    at [index, ..., slot] in place and the queries attend to its slice.
    With `index` None, `cache` is this layer's own buffers
    (Cache.per_layer: keys [B, K, H, S]). Returns (x, cache, and with
    `collect` (x, attention probabilities))."""
    h = self.pre_attn_norm(x)
    rotation = rotations[self.layer_type]
    k, v = self.attn.project_kv(h, rotation)
    own_buffers = cache is not None and index is None
    if own_buffers:
      cache = tuple(
          jax.lax.dynamic_update_slice(
              own, new.reshape(own.shape[:-2] + new.shape[-2:]).astype(
                  own.dtype), (0,) * (own.ndim - 2) + at)
          for own, new, at in zip(cache, (jnp.swapaxes(k, -1, -2), v),
                                  ((0, slot), (slot, 0))))
      k, v = (own.reshape(k.shape[:2] + own.shape[-2:]) for own in cache)
    elif cache is not None:
      cache = tuple(
          jax.lax.dynamic_update_slice(
              stack, new[None].astype(stack.dtype), (index, 0, 0, slot, 0))
          for stack, new in zip(cache, (k, v)))
      k, v = (jax.lax.dynamic_index_in_dim(stack, index, keepdims=False)
              for stack in cache)
    a = self.attn(h, rotation, masks[self.layer_type], (k, v), shard,
                  with_probs=collect, keys_hs=own_buffers)
    a, probs = a if collect else (a, None)
    if self.post_norms:
      a = self.post_attn_norm(a)
    x = shard(x + a, 'batch', 'length', None)
    m = self.mlp(self.pre_mlp_norm(x), shard)
    if self.post_norms:
      m = self.post_mlp_norm(m)
    x = shard(x + m, 'batch', 'length', None)
    return x, cache, (x, probs) if collect else None


class Decoder(nnx.Module):
  """A decoder-only LM of any supported family."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs,
               param_dtype=jnp.float32, dtype=jnp.float32, scan: bool = True,
               remat: str = 'none', microbatches: int = 4):
    if remat not in REMAT_POLICIES:
      raise ValueError(f'unknown remat policy {remat!r}; use one of '
                       f'{", ".join(REMAT_POLICIES)}')
    self.cfg, self.dtype, self.scan, self.remat = cfg, dtype, scan, remat
    self.microbatches = microbatches  # a pipeline's (`_pipelined`)
    d, v = cfg.embed_dim, cfg.vocab_size
    self.embedding = layers.param(rngs, (v, d), ('vocab', 'embed'), 0,
                                  param_dtype, fan_in=d)
    self.groups = nnx.List([
        nnx.List([Layer(cfg, t, stack=repeats, dtype=param_dtype, rngs=rngs)
                  for t in pattern])
        for pattern, repeats in cfg.groups])
    self.final_norm = layers.RMSNorm(d, cfg, stack=0, dtype=param_dtype,
                                     rngs=rngs)
    if not cfg.tie_embeddings:
      self.lm_head = layers.param(rngs, (d, v), ('embed', 'vocab'), 0,
                                  param_dtype, fan_in=d)
    if cfg.vision:
      self.vision = vision.Tower(cfg, param_dtype=param_dtype, dtype=dtype,
                                 rngs=rngs)

  def __call__(self, tokens: jax.Array, positions: jax.Array,
               segment_ids: jax.Array, cache: Cache | None = None,
               cache_slot: jax.Array | int = 0,
               shard: Sharder = Sharder(), last_only: bool = False,
               layers: Layers | None = None, rotations: Any = None,
               images: jax.Array | None = None
               ) -> tuple[jax.Array, Cache | None]:
    """tokens, positions, segment_ids: [B, T] (segment 0 = padding).

    Returns float32 logits [B, T, V] ([B, 1, V] for the last position only
    with `last_only`: a prefill needs no others) and the updated cache (or
    None). With `layers` (`split_layers`), the layers run one after another
    from those parameters; `rotations`: `self.rotations(positions)`,
    computed ahead; `images` [B, I, C, H, W]: each row's images, whose
    soft tokens take the places of its image tokens in order (a model
    with a vision tower)."""
    x, cache = self.hidden(tokens, positions, segment_ids, cache, cache_slot,
                           shard, layers, rotations, images)
    if last_only:
      x = x[:, -1:]
    return self.logits(x, shard), cache

  def logits(self, x: jax.Array, shard: Sharder = Sharder()) -> jax.Array:
    """Final-normed hidden states [B, T, D] -> float32 logits [B, T, V]."""
    cfg = self.cfg
    b, t, _ = x.shape
    x2 = x.reshape(b * t, cfg.embed_dim)
    if cfg.tie_embeddings:
      logits = jnp.einsum('ND,VD->NV', x2,
                          self.embedding[...].astype(self.dtype),
                          preferred_element_type=jnp.float32)
    else:
      logits = jnp.einsum('ND,DV->NV', x2, self.lm_head[...].astype(
          self.dtype), preferred_element_type=jnp.float32)
    logits = logits.reshape(b, t, cfg.vocab_size)
    if cfg.final_softcap:
      logits = jnp.tanh(logits / cfg.final_softcap) * cfg.final_softcap
    return shard(logits, 'batch', 'length', 'vocab')

  def hidden(self, tokens: jax.Array, positions: jax.Array,
             segment_ids: jax.Array, cache: Cache | None = None,
             cache_slot: jax.Array | int = 0,
             shard: Sharder = Sharder(), layers: Layers | None = None,
             rotations: Any = None, images: jax.Array | None = None
             ) -> tuple[jax.Array, Cache | None]:
    """The final-normed hidden states [B, T, D] (what the LM head and a
    value head read) and the updated cache (or None)."""
    x, cache, _ = self._forward(tokens, positions, segment_ids, cache,
                                cache_slot, shard, collect=False,
                                layers=layers, rotations=rotations,
                                images=images)
    return x, cache

  def embed(self, tokens: jax.Array, images: jax.Array | None = None
            ) -> tuple[jax.Array, jax.Array | None]:
    """The input embeddings [B, T, D], with `images`' soft tokens in place
    of the image tokens, and the image blocks (`vision.image_blocks`; None
    without images). Only a row's first I x tokens_per_image image tokens
    are images (I: `images`' second axis; a row with fewer images has
    zero images in the rest of its slots)."""
    cfg = self.cfg
    is_image = None
    if images is not None:
      if not cfg.vision:
        raise ValueError(f'images given to a {cfg.family} model without a '
                         'vision tower')
      # The images' tokens come first; an image token after them (one a
      # sampler drew) stays text, as the sampler's decode steps read it.
      is_image = tokens == cfg.vision.image_token
      is_image &= jnp.cumsum(is_image, axis=1) <= (
          images.shape[1] * cfg.vision.tokens_per_image)
      tokens = jnp.where(is_image, 0, tokens)
    x = jnp.take(self.embedding[...], tokens, axis=0).astype(self.dtype)
    if cfg.embed_scale:
      x = x * jnp.asarray(cfg.embed_dim ** 0.5, self.dtype)
    if is_image is None:
      return x, None
    b, count = images.shape[:2]
    soft = self.vision(images.reshape((b * count,) + images.shape[2:]))
    x = vision.merge(x, is_image, soft.reshape(b, -1, cfg.embed_dim))
    return x, vision.image_blocks(is_image)

  def rotations(self, positions: jax.Array) -> dict[str, Any]:
    """RoPE's (sin, cos) per layer type at positions [B, T]. A decode
    loop computes every step's before the loop: XLA computes them inside
    each rotation it fuses, for every head (4% of a small model's decode
    step)."""
    cfg = self.cfg
    return {t: layers.rotation(positions, cfg.rope(t), cfg.head_dim)
            for t in set(cfg.layer_types)}

  def split_layers(self) -> Layers:
    """Each group's parameters one repeat at a time, for `layers`: a
    decode loop slices them once, before the loop. (XLA:CPU copies a slice
    of a stacked weight wherever it is read, so every decode step of a
    scanned model would copy all of its weights: a quarter of a small
    model's step.)"""
    return tuple(_per_repeat(nnx.split(group)[1]) for group in self.groups)

  def internals(self, tokens: jax.Array, positions: jax.Array,
                segment_ids: jax.Array, shard: Sharder = Sharder()
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """For distillation: the logits [B, T, V], every layer's output
    [layers, B, T, D] and attention probabilities [layers, B, heads, T, T],
    layers in order."""
    x, _, (outputs, probs) = self._forward(tokens, positions, segment_ids,
                                           None, 0, shard, collect=True)
    return self.logits(x, shard), outputs, probs

  def _forward(self, tokens, positions, segment_ids, cache, cache_slot,
               shard, collect: bool, layers: Layers | None = None,
               rotations: Any = None, images: jax.Array | None = None):
    cfg = self.cfg
    b, t = tokens.shape
    x, blocks = self.embed(tokens, images)
    x = shard(x, 'batch', 'length', None)

    q_slots = jnp.broadcast_to(cache_slot + jnp.arange(t), (b, t))
    if cache is None:
      masks = attention_masks(cfg, positions, segment_ids, q_slots,
                              positions, segment_ids, q_slots, blocks,
                              blocks)
    else:
      cache = cache.replace(
          positions=jax.lax.dynamic_update_slice_in_dim(
              cache.positions, positions.astype(jnp.int32), cache_slot, 1),
          segments=jax.lax.dynamic_update_slice_in_dim(
              cache.segments, segment_ids.astype(jnp.int32), cache_slot, 1))
      kv_slots = jnp.broadcast_to(jnp.arange(cache.size), (b, cache.size))
      # An image's tokens all arrive in one call (the prefill).
      kv_blocks = None if blocks is None else (
          jax.lax.dynamic_update_slice_in_dim(
              jnp.full((b, cache.size), -1, blocks.dtype), blocks,
              cache_slot, 1))
      masks = attention_masks(cfg, positions, segment_ids, q_slots,
                              cache.positions, cache.segments, kv_slots,
                              blocks, kv_blocks)

    if rotations is None:
      rotations = self.rotations(positions)
    new_kv, collected = [], []
    for g, group in enumerate(self.groups):
      group_cache = None if cache is None else (cache.k[g], cache.v[g])
      (x, kv), per_layer = self._run_group(
          group, x, rotations, masks, group_cache, cache_slot, shard,
          collect, None if layers is None else layers[g])
      new_kv.append(kv)
      collected.append(per_layer)
    if cache is not None:
      cache = cache.replace(k=tuple(kv[0] for kv in new_kv),
                            v=tuple(kv[1] for kv in new_kv))
    if collect:  # [layers, ...] in order, group after group
      collected = tuple(jnp.concatenate(parts) for parts in zip(*collected))
    return self.final_norm(x), cache, collected if collect else None

  def _run_group(self, group, x, rotations, masks, group_cache, slot, shard,
                 collect: bool = False, repeats=None):
    """Runs a group's repeats (from `repeats`, the parameters of each,
    when given); its cache ((keys, values) per pattern position) is
    carried through them and updated in place, so a decode step copies no
    cache. With `collect`, also each layer's (output, attention
    probabilities), stacked [repeats x pattern, ...] in layer order. On a
    mesh whose `stage` axes divide the repeats, a pass without a cache runs
    them as a pipeline (`_pipelined`)."""
    graphdef, state = nnx.split(group)
    count = jax.tree.leaves(state)[0].shape[0]
    stages = shard.ways('layers')
    if (stages > 1 and count % stages == 0 and group_cache is None and
        not collect and repeats is None):
      return (self._pipelined(graphdef, state, x, rotations, masks, shard),
              None), None
    body = self._body(graphdef, rotations, masks, slot, shard, collect)
    carry = (x, group_cache)
    if self.scan and repeats is None:
      carry, ys = jax.lax.scan(body, carry, (state, jnp.arange(count)))
    else:
      steps = []
      per_layer = group_cache is not None and isinstance(group_cache[0][0],
                                                         tuple)
      for r, layer_state in enumerate(repeats or _per_repeat(state)):
        if per_layer:  # this repeat's own buffers (Cache.per_layer)
          x, cache = carry
          (x, own), y = body((x, _at(cache, r)), (layer_state, None))
          carry = x, tuple(tuple(parts[:r] + (mine,) + parts[r + 1:]
                                 for parts, mine in zip(side, own_side))
                           for side, own_side in zip(cache, own))
        else:
          carry, y = body(carry, (layer_state, r))
        steps.append(y)
      ys = jax.tree.map(lambda *v: jnp.stack(v), *steps) if collect else None
    if collect:  # [repeats, pattern, ...] -> [repeats x pattern, ...]
      ys = tuple(y.reshape((-1,) + y.shape[2:]) for y in ys)
    return carry, ys

  def _body(self, graphdef, rotations, masks, slot, shard, collect):
    """One repeat of a group, as a scan body: ((x, cache), (its
    parameters, its index)) -> ((x, cache), what `collect` keeps)."""
    dtype = self.dtype

    def body(carry, xs):
      x, cache = carry
      layer_state, index = xs
      layer_state = jax.tree.map(lambda p: p.astype(dtype), layer_state)
      out, per_layer = [], []
      for i, layer in enumerate(nnx.merge(graphdef, layer_state)):
        x, kv, seen = layer(x, rotations, masks,
                            None if cache is None else (cache[0][i],
                                                        cache[1][i]),
                            index, slot, shard, collect)
        out.append(kv)
        per_layer.append(seen)
      if cache is not None:
        cache = (tuple(kv[0] for kv in out), tuple(kv[1] for kv in out))
      return (x, cache), (tuple(jnp.stack(v) for v in zip(*per_layer))
                          if collect else None)

    if self.remat == 'none':
      return body
    return jax.checkpoint(body, policy=REMAT_POLICIES[self.remat],
                          prevent_cse=not self.scan)

  def _pipelined(self, graphdef, state, x, rotations, masks, shard):
    """A group's repeats as a pipeline (GPipe's schedule): stage s of the
    mesh's `stage` axes holds repeats [s R/S, (s+1) R/S), where the
    'layers' rule puts them; the rows split into `microbatches`, which
    enter stage 0 one a tick, and at each tick every stage runs its
    repeats on the micro-batch it holds, then passes it to the next stage
    (a collective permute). M + S - 1 ticks, of which each stage idles
    S - 1 (`bubble`); autodiff runs the ticks backwards for the gradient.
    Each micro-batch's RoPE angles and masks follow it. Same values as
    the layers run in order."""
    stages, micro, rows = shard.ways('layers'), self.microbatches, x.shape[0]
    if rows % micro:
      raise UsageError(
          f'--config.model.pipeline_microbatches={micro} does not divide '
          f'the {rows} rows of a pipelined pass; use a divisor of {rows} '
          f'of at least {stages} (the stages).')
    split = lambda a: a.reshape((micro, rows // micro) + a.shape[1:])
    inputs, side = split(x), jax.tree.map(split, (rotations, masks))
    parts = jax.tree.map(lambda p: p.reshape((stages, -1) + p.shape[1:]),
                         state)

    def stage(part, x, side):
      body = self._body(graphdef, *side, 0, shard.within('layers'),
                        collect=False)
      count = jax.tree.leaves(part)[0].shape[0]
      return jax.lax.scan(body, (x, None), (part, jnp.arange(count)))[0][0]
    stage = jax.vmap(stage, spmd_axis_name=shard.axes('layers'))

    def tick(held, t):
      entering = jax.lax.dynamic_index_in_dim(inputs, jnp.minimum(
          t, micro - 1))
      held = shard(jnp.concatenate([entering, held[:-1]]),
                   'layers', 'batch', 'length', None)
      which = jnp.clip(t - jnp.arange(stages), 0, micro - 1)
      held = stage(parts, held, jax.tree.map(lambda a: a[which], side))
      return held, held[-1]
    held = jnp.zeros((stages,) + inputs.shape[1:], x.dtype)
    _, out = jax.lax.scan(tick, held, jnp.arange(micro + stages - 1))
    return out[stages - 1:].reshape(x.shape)


def bubble(stages: int, microbatches: int) -> float:
  """The fraction of a pipelined pass each stage idles."""
  return (stages - 1) / (microbatches + stages - 1)


def _at(cache: Any, r: int) -> Any:
  """Repeat `r`'s (keys, values) per pattern position, of a group's cache
  in per-layer buffers."""
  return tuple(tuple(parts[r] for parts in side) for side in cache)


def _per_repeat(state: nnx.State) -> tuple[nnx.State, ...]:
  """A group's stacked parameters, one state per repeat."""
  return tuple(jax.tree.map(operator.itemgetter(r), state)
               for r in range(jax.tree.leaves(state)[0].shape[0]))


def unrolled(module: nnx.Module) -> nnx.Module:
  """`module` with each of its decoders running its layers one after
  another, unscanned (for a CPU train step: XLA:CPU copies every scanned
  layer's weights, activations and gradients in and out of the stacked
  buffers; unrolled, a small model's GRPO train step takes 15% less time).
  Same parameters; the backward pass's float rounding differs under
  sharding (XLA partitions it differently)."""
  for _, node in nnx.iter_graph(module):
    if isinstance(node, Decoder):
      node.scan = False
  return module


def abstract(cfg: ModelConfig, **kwargs) -> Decoder:
  """The decoder with shapes only: nothing allocated (for presets, counts,
  shardings and loaders)."""
  return nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0), **kwargs))


def logical_axes(state: nnx.State) -> Any:
  """The pytree of logical-axis tuples matching `state`'s parameters."""
  return jax.tree.map(lambda v: v.get_metadata()['axes'], state,
                      is_leaf=lambda v: isinstance(v, nnx.Variable))
