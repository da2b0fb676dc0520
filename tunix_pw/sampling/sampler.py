"""The built-in rollout engine: a KV-cache sampler compiled end to end.

One jitted program per shape bucket does the prefill of left-padded prompts
and a `while_loop` of one-token decode steps (no Python per token), stopping
when every row has hit a stop token or its budget. Prompt lengths and token
budgets round up to buckets (powers of two from 16), so varying lengths do
not recompile. On a rollout mesh the batch is sharded over the data axes and
heads over tensor axes, by the same logical rules as training.

Partial rollouts (`decode_chunk`): the decode loop runs `decode_chunk` steps
per call instead, and each call serves the newest weights, so weights that
arrive mid-generation (asynchronous RL) take over without dropping the
sequences in flight; every token records the version of the weights that
produced it.
"""

from __future__ import annotations

from collections.abc import Sequence
import functools
import math
import threading
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np
import psutil

from tunix_pw.errors import UsageError
from tunix_pw.models.decoder import Cache, Decoder
from tunix_pw.runtime.sharding import Sharder
from tunix_pw.runtime import backend, reshard, sharding
from tunix_pw.sampling import rules as decoding, tree as tree_lib
from tunix_pw.sampling.rollout import Completions, SamplingConfig

_KV_AXES = (None, 'batch', 'kv_heads', None, None)  # [repeats, B, K, S, H]


class Sampler:
  """Implements RolloutEngine for a Decoder, on one mesh (or one device)."""

  def __init__(self, model: Decoder, *, pad_id: int,
               eos_ids: Sequence[int], mesh: Mesh | None = None,
               rules: Any = None, runtime: backend.Runtime | None = None,
               max_cache: int | None = None,
               sync_budget: reshard.Budget = reshard.Budget(),
               decode_chunk: int = 0):
    self.graphdef, self.params = nnx.split(model)
    self.version = 0  # of the weights served (update_weights' `version`)
    self._serving = threading.Lock()  # params and version change together
    self.decode_chunk = decode_chunk  # 0: the whole decode loop in one call
    self.cfg = model.cfg
    self.cache_dtype = model.dtype
    self.pad_id, self.eos_ids = pad_id, tuple(eos_ids)
    self.mesh, self.rules, self.runtime = mesh, rules, runtime
    self.split_layers = _split_layers(model, mesh)
    self.sync_budget = sync_budget  # what update_weights stages at once
    self.max_cache = max_cache or self.cfg.max_position
    self.traces = 0  # compilations of the generate program, for tests
    self.last_sync: reshard.Stats | None = None
    statics = ('cache_size', 'top_k', 'use_top_p', 'greedy')
    self._generate = jax.jit(self._program,
                             static_argnames=statics + ('generations',))
    self._prefill = jax.jit(self._start,
                            static_argnames=('cache_size', 'generations'))
    self._decode_chunk = jax.jit(self._continue, static_argnames=statics,
                                 donate_argnums=(1,))
    self._branch = jax.jit(self._take_rows)

  # ------------------------------------------------------------ weights

  def update_weights(self, params: nnx.State,
                     version: int | None = None) -> None:
    """Serve `params` (all of them, or a subset such as LoRA adapters):
    moved onto this engine's shardings by the runtime's reshard; `version`
    (the policy's step) tags the tokens they produce."""
    current = dict(self.params.flat_state())
    incoming = dict(params.flat_state())
    missing = [p for p in incoming if p not in current]
    if missing:
      raise ValueError(f'update_weights got unknown parameter {missing[0]}')
    sources = [incoming[p].get_value() for p in incoming]
    targets = [current[p].get_value().sharding for p in incoming]
    if self.runtime is None:
      moved = jax.device_put(sources, targets)
    else:
      moved, self.last_sync = reshard.transfer(sources, targets, self.runtime,
                                               budget=self.sync_budget)
    for path, value in zip(incoming, moved):
      # The previous weights are freed once nobody else holds them (the
      # engine may share them with the model it was built from).
      current[path] = current[path].replace(value)
    with self._serving:
      self.params = nnx.from_flat_state(list(current.items()))
      self.version = self.version if version is None else version

  def serving(self) -> tuple[nnx.State, int]:
    """The weights served now and their version."""
    with self._serving:
      return self.params, self.version

  # ------------------------------------------------------------- sample

  def generate(self, prompts: Sequence[Sequence[int]],
               sampling: SamplingConfig,
               images: Sequence[np.ndarray] | None = None) -> Completions:
    """`sampling.generations` completions of each prompt, rows
    prompt-major. `images`: per prompt, its images [I, C, H, W] (the
    processor's pixels), whose soft tokens take its image tokens' places
    in order (a model with a vision tower)."""
    rows, cache_size = self._prompt_rows(prompts, sampling, images)
    if self.decode_chunk:
      return self._generate_in_chunks(rows, sampling, cache_size)
    out = self._generate(self.serving()[0], *rows, *self._scalars(sampling),
                         cache_size=cache_size,
                         generations=sampling.generations,
                         **self._statics(sampling))
    n = sampling.max_new_tokens
    tokens, logprobs, mask, lengths, kept = out
    return Completions(tokens[:, :n], logprobs[:, :n], mask[:, :n], lengths,
                       log_kept=kept[:, :n])

  def _prompt_rows(self, prompts: Sequence[Sequence[int]],
                   sampling: SamplingConfig,
                   images: Sequence[np.ndarray] | None = None
                   ) -> tuple[tuple[jax.Array, ...], int]:
    """The prompts left-padded to their bucket (tokens, positions,
    segments, and their images or None) on the mesh, and the cache
    size."""
    if not prompts:
      raise UsageError('no prompts to generate from.')
    lengths = [len(p) for p in prompts]
    if min(lengths) == 0:
      raise UsageError(f'prompt {lengths.index(0)} is empty.')
    prompt_len, cache_size = self._sizes(max(lengths), sampling)
    if max(lengths) + sampling.max_new_tokens > self.max_cache:
      raise UsageError(
          f'a prompt of {max(lengths)} tokens plus {sampling.max_new_tokens} '
          f'new tokens exceeds the cache of {self.max_cache} positions.')
    batch = len(prompts)
    tokens = np.full((batch, prompt_len), self.pad_id, np.int32)
    for row, p in enumerate(prompts):  # left padding: every row ends at P-1
      tokens[row, prompt_len - len(p):] = p
    segments = (np.arange(prompt_len)[None] >=
                prompt_len - np.array(lengths)[:, None]).astype(np.int32)
    positions = np.maximum(np.cumsum(segments, axis=1) - 1, 0)
    put = self._put_batch
    if images is not None:
      images = put(self._images(prompts, images))
    return (put(tokens), put(positions), put(segments), images), cache_size

  def _images(self, prompts: Sequence[Sequence[int]],
              images: Sequence[np.ndarray]) -> np.ndarray:
    """Each prompt's images, checked against its image tokens, in one
    array [P, most images, C, H, W] (zeros after a prompt's own)."""
    vision = self.cfg.vision
    if vision is None:
      raise UsageError(f'images given to a {self.cfg.family} model, which '
                       'has no vision tower.')
    if len(images) != len(prompts):
      raise UsageError(f'{len(images)} image lists for {len(prompts)} '
                       'prompts.')
    shape = (vision.channels, vision.image_size, vision.image_size)
    out = np.zeros((len(prompts), max(len(i) for i in images) or 1) + shape,
                   np.float32)
    for row, (prompt, own) in enumerate(zip(prompts, images)):
      tokens = sum(t == vision.image_token for t in prompt)
      if tokens != len(own) * vision.tokens_per_image:
        raise UsageError(
            f'prompt {row} has {tokens} image tokens for {len(own)} images '
            f'of {vision.tokens_per_image} tokens each.')
      for i, image in enumerate(own):
        if np.shape(image) != shape:
          raise UsageError(f'image {i} of prompt {row} has shape '
                           f'{np.shape(image)}, expected {shape}.')
        out[row, i] = image
    return out

  def _generate_in_chunks(self, rows: tuple[jax.Array, ...],
                          sampling: SamplingConfig,
                          cache_size: int) -> Completions:
    """The decode loop `decode_chunk` steps per call, each with the
    weights served when it starts (partial rollouts)."""
    max_new, stops, temperature, top_p, key = self._scalars(sampling)
    params, version = self.serving()
    state = self._prefill(params, *rows, key, cache_size=cache_size,
                          generations=sampling.generations)
    n = sampling.max_new_tokens
    versions = np.zeros((len(state[5]), n), np.int32)
    for start in range(0, n, self.decode_chunk):
      if start:
        params, version = self.serving()
      state = self._decode_chunk(
          params, state, np.int32(start + self.decode_chunk), max_new, stops,
          temperature, top_p, cache_size=cache_size,
          **self._statics(sampling))
      versions[:, start:start + self.decode_chunk] = version
      if bool(jax.device_get(jnp.all(state[6]))):  # every row stopped
        break
    tokens, logprobs, lengths = state[3], state[4], state[5]
    mask = jnp.arange(tokens.shape[1])[None] < lengths[:, None]
    return Completions(tokens[:, :n], logprobs[:, :n], mask[:, :n], lengths,
                       versions, state[9][:, :n])

  def generate_tree(self, prompts: Sequence[Sequence[int]],
                    sampling: SamplingConfig,
                    shape: tree_lib.TreeShape) -> tree_lib.Tree:
    """`sampling.generations` rows per prompt grown as a tree
    (sampling/tree.py): `shape.chains` decode from the prompt, and after
    every `shape.segment` tokens the most uncertain live chains fork into
    unused rows, their KV cache copied. The decode batch holds the used
    rows only (`tree.layout`), so it grows with the tree."""
    shape.check(sampling.generations)
    rows, cache_size = self._prompt_rows(prompts, sampling)
    max_new, stops, temperature, top_p, key = self._scalars(sampling)
    params = self.serving()[0]
    g, n = sampling.generations, sampling.max_new_tokens
    active = tree_lib.roots(len(prompts), g, shape.chains)
    parent = np.full(active.shape, -1)
    born = np.zeros(active.shape, np.int32)
    slots = tree_lib.layout(active, g)  # batch row -> its row of the tree
    state = self._prefill(params, *rows, key, cache_size=cache_size,
                          generations=len(slots) // len(prompts))
    never = np.zeros(len(slots), bool)
    state = self._branch(state, np.arange(len(slots)), slots < 0, never, key)
    for start in range(0, n, shape.segment):
      end = min(start + shape.segment, n)
      state = self._decode_chunk(
          params, state, np.int32(end), max_new, stops, temperature, top_p,
          cache_size=cache_size, **self._statics(sampling))
      logprobs, lengths, done = jax.device_get(state[4:7])
      used = slots >= 0
      row_done = np.ones(active.shape, bool)
      row_done[slots[used]] = done[used]
      if end == n or row_done[active].all():
        break
      uncertainty = np.zeros(active.shape)
      uncertainty[slots[used]] = tree_lib.surprisal(
          logprobs, lengths, start, end)[used]
      source = tree_lib.branch(shape, g, active, row_done, uncertainty)
      forked = source != np.arange(len(source))
      if forked.any():
        parent[forked], born[forked], active[forked] = source[forked], end, True
        batch_row = dict(zip(slots[used], np.flatnonzero(used)))
        slots = tree_lib.layout(active, g)
        state = self._branch(
            state, np.array([batch_row[source[s]] if s >= 0 else 0
                             for s in slots]), slots < 0,
            (slots >= 0) & forked[slots], jax.random.fold_in(key, end))
    return tree_lib.Tree(self._by_tree_row(state, slots, len(active), n),
                         parent, born, active)

  def _by_tree_row(self, state, slots: np.ndarray, count: int,
                   n: int) -> Completions:
    """The decode state's completions, each batch row's at its row of the
    tree (`slots`); the tree's unused rows empty."""
    tokens, logprobs, lengths, kept = jax.device_get(
        (state[3][:, :n], state[4][:, :n], state[5], state[9][:, :n]))
    used = slots >= 0
    out = (np.full((count, n), self.pad_id, np.int32),
           np.zeros((count, n), np.float32), np.zeros(count, np.int32),
           np.zeros((count, n), np.float32))
    for whole, part in zip(out, (tokens, logprobs, lengths, kept)):
      whole[slots[used]] = part[used]
    mask = np.arange(n)[None] < out[2][:, None]
    return Completions(out[0], out[1], mask, out[2], log_kept=out[3])

  @staticmethod
  def _take_rows(state, rows, parked, fresh, key) -> tuple[Any, ...]:
    """The decode loop's state of batch rows `rows` of this one (a row
    repeated: a fork, its cache, tokens and counters copied); `parked`
    rows are done (padding), and `fresh` ones (new forks) draw random
    numbers of their own from `key`."""
    take = lambda a: a[rows]
    uniforms = state[8][:, rows]
    uniforms = jnp.where(fresh[None], jax.random.uniform(key, uniforms.shape),
                         uniforms)
    return (state[0], state[1].take(rows), *map(take, state[2:6]),
            take(state[6]) | parked, take(state[7]), uniforms,
            take(state[9]))

  def lower(self, batch: int, prompt_length: int,
            sampling: SamplingConfig) -> jax.stages.Lowered:
    """The generate program for `batch` prompts of up to `prompt_length`
    tokens (`sampling.generations` rows each), from shapes alone (the
    weights may be ShapeDtypeStructs with shardings): what compile-only
    checks compile."""
    prompt_len, cache_size = self._sizes(prompt_length, sampling)
    rows = jax.ShapeDtypeStruct((batch, prompt_len), jnp.int32,
                                sharding=self._batch_sharding(
                                    (batch, prompt_len)))
    replicated = NamedSharding(self.mesh, PartitionSpec())
    scalars = [jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=replicated)
               for x in self._scalars(sampling)]
    return self._generate.lower(self.params, rows, rows, rows, None,
                                *scalars,
                                cache_size=cache_size,
                                generations=sampling.generations,
                                **self._statics(sampling))

  def programs(self, batch: int, prompt_length: int,
               sampling: SamplingConfig) -> list[Any]:
    """What `generate` compiles for such a call, compiled from shapes:
    the generate program, or with `decode_chunk` the prefill and the
    decode chunk."""
    if not self.decode_chunk:
      return [self.lower(batch, prompt_length, sampling).compile()]
    prompt_len, cache_size = self._sizes(prompt_length, sampling)
    rows = jax.ShapeDtypeStruct((batch, prompt_len), jnp.int32,
                                sharding=self._batch_sharding(
                                    (batch, prompt_len)))
    max_new, stops, temperature, top_p, key = self._scalars(sampling)
    start = self._prefill.lower(
        self.params, rows, rows, rows, None, key, cache_size=cache_size,
        generations=sampling.generations).compile()
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=x.sharding), start.out_info)
    return [start, self._decode_chunk.lower(
        self.params, state, np.int32(0), max_new, stops, temperature, top_p,
        cache_size=cache_size, **self._statics(sampling)).compile()]

  def cache_bytes(self, batch: int, prompt_length: int,
                  sampling: SamplingConfig) -> int:
    """Bytes per device of the KV cache `lower`'s program allocates."""
    _, cache_size = self._sizes(prompt_length, sampling)
    cache = jax.eval_shape(lambda: Cache.empty(
        self.cfg, batch * sampling.generations, cache_size, self.cache_dtype))
    return sum(
        math.prod(sharding.named(self.mesh, x.shape, _KV_AXES,
                                 self.rules).shard_shape(x.shape)) *
        x.dtype.itemsize for x in jax.tree.leaves((cache.k, cache.v)))

  def _sizes(self, prompt_length: int,
             sampling: SamplingConfig) -> tuple[int, int]:
    """(prompt bucket, cache size) for prompts of up to `prompt_length`."""
    prompt_len = decoding.bucket(prompt_length)
    return prompt_len, prompt_len + decoding.bucket(sampling.max_new_tokens)

  def _scalars(self, sampling: SamplingConfig) -> tuple[Any, ...]:
    stops = () if sampling.ignore_eos else self.eos_ids + sampling.stop_ids
    return (np.int32(sampling.max_new_tokens),
            np.array(stops or (-1,), np.int32),
            np.float32(sampling.temperature or 1.0),
            np.float32(sampling.top_p), jax.random.key(sampling.seed))

  @staticmethod
  def _statics(sampling: SamplingConfig) -> dict[str, Any]:
    return dict(top_k=sampling.top_k, use_top_p=sampling.top_p < 1.0,
                greedy=sampling.is_greedy)

  def _batch_sharding(self, shape: tuple[int, ...]) -> Any:
    return sharding.batch(self.mesh, shape, self.rules)

  def _put_batch(self, x: np.ndarray) -> jax.Array:
    if self.mesh is None:
      return jnp.asarray(x)
    return jax.device_put(x, self._batch_sharding(x.shape))

  def _start(self, params, tokens, positions, segments, images, key, *,
             cache_size, generations) -> tuple[Any, ...]:
    """The prefill: the decode loop's state before its first step. Each
    prompt's prefill serves its `generations` rows (and reads its images
    once)."""
    model = nnx.merge(self.graphdef, params)
    shard = Sharder(self.mesh, self.rules)
    prompts, prompt_len = tokens.shape
    batch, budget = prompts * generations, cache_size - prompt_len

    def kv_on_mesh(cache):
      on_mesh = lambda a: shard(a, *_kv_axes(a, self.cfg.num_kv_heads))
      return cache.replace(k=jax.tree.map(on_mesh, cache.k),
                           v=jax.tree.map(on_mesh, cache.v))

    cache = kv_on_mesh(Cache.empty(self.cfg, prompts, cache_size,
                                   self.cache_dtype))
    layers = model.split_layers() if self.split_layers else None
    logits, cache = model(tokens, positions, segments, cache, 0, shard=shard,
                          last_only=True, layers=layers, images=images)
    if generations > 1:
      cache = kv_on_mesh(cache.repeat(generations))
      logits, positions = (jnp.repeat(x, generations, axis=0)
                           for x in (logits, positions))
    if self.split_layers:  # the decode loop's layers read theirs in place
      cache = kv_on_mesh(cache.per_layer())
    # Every step's random numbers at once: one per row and step, drawn
    # outside the loop (a few KB; the loop then runs no generator).
    uniforms = jax.random.uniform(key, (budget, batch))
    return (jnp.int32(0), cache, logits[:, -1],
            jnp.full((batch, budget), self.pad_id, jnp.int32),
            jnp.zeros((batch, budget), jnp.float32),
            jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), bool),
            positions[:, -1] + 1, uniforms,
            jnp.zeros((batch, budget), jnp.float32))

  def _continue(self, params, state, until, max_new, stops, temperature,
                top_p, *, cache_size, top_k, use_top_p,
                greedy) -> tuple[Any, ...]:
    """One-token decode steps from `state` until step `until`, `max_new`
    or every row's stop."""
    model = nnx.merge(self.graphdef, params)
    layers = model.split_layers() if self.split_layers else None
    shard = Sharder(self.mesh, self.rules)
    next_position, uniforms = state[7], state[8]
    prompt_len = cache_size - uniforms.shape[0]
    # Every step's RoPE angles at once, before the loop (as its uniforms).
    rotations = model.rotations(next_position[:, None] +
                                jnp.arange(uniforms.shape[0]))
    pick = functools.partial(decoding.sample, temperature=temperature,
                             top_p=top_p, top_k=top_k, use_top_p=use_top_p,
                             greedy=greedy)

    def body(state):
      step, cache, last, out_tokens, out_logprobs, lengths, done = state[:7]
      # Each row's logits whole on its devices: the sampling rule's scans
      # over a vocabulary split across devices cost more than this gather
      # (on CPU, 6-10x the generation of a vocab-32k model).
      last = shard(last, 'batch', None)
      token, log_kept = pick(last, uniforms[step])
      token = token.astype(jnp.int32)
      # The policy at `temperature` (before top-k and top-p), as the
      # trainer's log-probabilities (rl/loss.py).
      logprob = jnp.take_along_axis(jax.nn.log_softmax(last / temperature),
                                    token[:, None], axis=-1)[:, 0]
      live = ~done
      out_tokens = out_tokens.at[:, step].set(
          jnp.where(live, token, self.pad_id))
      out_logprobs = out_logprobs.at[:, step].set(
          jnp.where(live, logprob, 0.0))
      out_kept = state[9].at[:, step].set(jnp.where(live, log_kept, 0.0))
      lengths = lengths + live
      done = done | jnp.isin(token, stops) | (step + 1 >= max_new)
      logits, cache = model(token[:, None], (next_position + step)[:, None],
                            live.astype(jnp.int32)[:, None], cache,
                            prompt_len + step, shard=shard, layers=layers,
                            rotations=jax.tree.map(
                                lambda a: jax.lax.dynamic_slice_in_dim(
                                    a, step, 1, axis=1), rotations))
      return (step + 1, cache, logits[:, 0], out_tokens, out_logprobs,
              lengths, done) + state[7:9] + (out_kept,)

    def cond(state):
      step, done = state[0], state[6]
      return (step < jnp.minimum(until, max_new)) & ~jnp.all(done)

    return jax.lax.while_loop(cond, body, state)

  def _program(self, params, tokens, positions, segments, images, max_new,
               stops, temperature, top_p, key, *, cache_size, top_k,
               use_top_p, greedy, generations) -> tuple[jax.Array, ...]:
    """The whole generation in one program: the prefill and the decode
    loop to the end."""
    self.traces += 1  # runs once per compilation (tracing), not per call
    state = self._start(params, tokens, positions, segments, images, key,
                        cache_size=cache_size, generations=generations)
    state = self._continue(params, state, max_new, max_new, stops,
                           temperature, top_p, cache_size=cache_size,
                           top_k=top_k, use_top_p=use_top_p, greedy=greedy)
    out_tokens, out_logprobs, lengths = state[3], state[4], state[5]
    mask = jnp.arange(out_tokens.shape[1])[None] < lengths[:, None]
    return out_tokens, out_logprobs, mask, lengths, state[9]


def _kv_axes(kv: jax.Array, kv_heads: int) -> tuple[str | None, ...]:
  """A cache buffer's logical axes: stacked [repeats, B, K, S, H], or one
  layer's (Cache.per_layer) without its batch and head axes of size 1."""
  if kv.ndim == len(_KV_AXES):
    return _KV_AXES
  heads = ('kv_heads',) if kv_heads > 1 else ()
  batch = ('batch',) if kv.ndim == len(heads) + 3 else ()
  return batch + heads + (None, None)


def _split_layers(model: Decoder, mesh: Mesh | None) -> bool:
  """Whether the decode loop reads each layer's weights sliced once per
  call: on CPU, where XLA copies a layer's weights out of the stacked ones
  at every decode step, when that second copy of them is small beside the
  host's memory. (TPUs read such slices in place.)"""
  devices = jax.devices() if mesh is None else mesh.devices.flat
  if next(iter(devices)).platform != 'cpu':
    return False
  copy = sum(math.prod(x.shape) * x.dtype.itemsize
             for x in jax.tree.leaves(nnx.state(model.groups)))
  return copy <= psutil.virtual_memory().total // 8


def make_sampler(model: Decoder, tokenizer: Any, **kwargs) -> Sampler:
  """A Sampler that stops on the tokenizer's stop ids."""
  return Sampler(model, pad_id=tokenizer.pad_id, eos_ids=tokenizer.stop_ids,
                 **kwargs)

