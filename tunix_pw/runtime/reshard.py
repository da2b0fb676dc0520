"""Moves a pytree to target shardings on any mesh: the Pathways-first chain.

`transfer(tree, shardings, runtime)` picks its path from the Runtime:

1. `pathways`: pathwaysutils' experimental (sidechannel) reshard with its plan
   cache, through a real intermediate sharding where pathwaysutils finds one.
2. `two_hop` (one controller addresses every device): a same-layout copy onto
   the destination devices, then a jitted relayout there (see two_hop.py).
3. `union_jit` (multi-controller, source and destination on different
   processes, which device_put cannot reach): one jitted program over the
   union of both device sets lands each shard on its destination device, then
   the same relayout.
4. `device_put`: the last rung.

Leaves move in groups of at most `group_bytes`; an InflightThrottler keeps at
most `max_inflight` groups unfinished, which bounds the staging memory, and
inputs are freed as soon as they are read, so peak memory stays near the tree
size. A rung that fails before any source was consumed falls through to the next,
with a logged reason.
Compiled plans are cached per (shape, dtype, source, target sharding).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import functools
import logging
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np

from tunix_pw.runtime import backend, two_hop
from tunix_pw.runtime.throttle import InflightThrottler
from tunix_pw.runtime.two_hop import Unsupported

PATHWAYS = 'pathways'
TWO_HOP = 'two_hop'
UNION_JIT = 'union_jit'
DEVICE_PUT = 'device_put'

DEFAULT_GROUP_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class Stats:
  path: str
  bytes: int
  seconds: float
  groups: int

  def metrics(self, prefix: str = 'reshard') -> dict[str, float | str]:
    return {f'{prefix}/path': self.path, f'{prefix}/bytes': self.bytes,
            f'{prefix}/seconds': self.seconds, f'{prefix}/groups': self.groups}


@dataclasses.dataclass(frozen=True)
class Budget:
  """What a transfer may stage at once: groups of at most `group_bytes`,
  at most `max_inflight` of them unfinished."""

  group_bytes: int = DEFAULT_GROUP_BYTES
  max_inflight: int = 2

  @classmethod
  def from_block(cls, block: Any) -> 'Budget':
    """From a config's runtime block (reshard_group_mib, max_inflight)."""
    return cls(block.reshard_group_mib << 20, block.max_inflight)


def transfer(tree: Any, shardings: Any, runtime: backend.Runtime, *,
             donate: bool = False,
             budget: Budget = Budget()) -> tuple[Any, Stats]:
  """Returns `tree` moved to `shardings` (a matching tree or a prefix) and
  what it took. With `donate`, the source arrays are deleted."""
  leaves, treedef = jax.tree.flatten(tree)
  targets = jax.api_util.flatten_axes('reshard shardings', treedef, shardings)
  start = time.perf_counter()
  is_key = [jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
            for x in leaves]
  # PRNG keys travel as their uint32 data and are rewrapped at the target.
  data = [jax.random.key_data(x) if k else x for x, k in zip(leaves, is_key)]
  data_targets = [_with_trailing_dim(t) if k else t
                  for t, k in zip(targets, is_key)]

  for path in _chain(runtime, data, data_targets):
    try:
      move_group = _PLANNERS[path](data, data_targets, donate)
      out, groups = _run_groups(data, budget.group_bytes,
                                budget.max_inflight, move_group)
      break
    except Exception as e:  # pylint: disable=broad-exception-caught
      if any(x.is_deleted() for x in data):
        raise  # a source is already consumed: nothing left to fall back on
      log = logging.info if isinstance(e, Unsupported) else logging.warning
      log('reshard: the %s path failed (%s: %s); falling through', path,
          type(e).__name__, e)
  else:
    raise RuntimeError('reshard: no path could move this tree')

  out = [jax.random.wrap_key_data(y, impl=jax.random.key_impl(x)) if k else y
         for x, y, k in zip(leaves, out, is_key)]
  if donate:  # key leaves share their buffers with the data moved above
    for x in leaves:
      if not x.is_deleted():
        x.delete()
  nbytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in data)
  stats = Stats(path, nbytes, time.perf_counter() - start, groups)
  return jax.tree.unflatten(treedef, out), stats


def _with_trailing_dim(sharding: jax.sharding.Sharding):
  if not isinstance(sharding, NamedSharding):
    return sharding
  return NamedSharding(sharding.mesh, PartitionSpec(*sharding.spec, None))


def _moves_devices(x: jax.Array, target: jax.sharding.Sharding) -> bool:
  return x.sharding.device_set != target.device_set


def _reorders(source: jax.sharding.Sharding, target: Any) -> bool:
  """The same devices in another mesh order: no one program spans both."""
  return (source.device_set == target.device_set and
          two_hop.devices(source) != two_hop.devices(target))


def _chain(runtime: backend.Runtime, leaves: Sequence[jax.Array],
           targets: Sequence[Any]) -> list[str]:
  if runtime.backend == backend.PATHWAYS:
    return [PATHWAYS, TWO_HOP, DEVICE_PUT]
  cross_process = any(
      _moves_devices(x, t) and not (x.sharding.is_fully_addressable and
                                    t.is_fully_addressable)
      for x, t in zip(leaves, targets))
  return [UNION_JIT, DEVICE_PUT] if cross_process else [TWO_HOP, DEVICE_PUT]


def _groups(leaves: Sequence[jax.Array], group_bytes: int) -> list[list[int]]:
  """Leaf indices in order, cut into groups of at most `group_bytes` (a larger
  leaf is a group of its own)."""
  groups, current, size = [], [], 0
  for i, x in enumerate(leaves):
    if current and size + x.nbytes > group_bytes:
      groups.append(current)
      current, size = [], 0
    current.append(i)
    size += x.nbytes
  return groups + [current] if current else groups


MoveGroup = Callable[[list[int], int, int], list[jax.Array]]


def _run_groups(leaves, group_bytes: int, max_inflight: int,
                move_group: MoveGroup) -> tuple[list[jax.Array], int]:
  out = [None] * len(leaves)
  groups = _groups(leaves, group_bytes)
  throttler = InflightThrottler(max_inflight)
  for group in groups:
    moved = move_group(group, group_bytes, max_inflight)
    for i, y in zip(group, moved):
      out[i] = y
    throttler.add(moved)  # blocks while max_inflight groups are unfinished
  throttler.wait_for_all()
  return out, len(groups)


# ---------------------------------------------------------------- pathways


def _plan_pathways(leaves, targets, donate: bool) -> MoveGroup:
  from pathwaysutils.experimental import reshard as pw  # pylint: disable=g-import-not-at-top
  intermediates = []
  for x, t in zip(leaves, targets):
    try:
      intermediate, _ = pw.find_intermediate_sharding(x.sharding, t)
      # A fully replicated intermediate is the all-gather this avoids.
      intermediates.append(None if intermediate.is_fully_replicated
                           else intermediate)
    except pw.NoIntermediateShardingError:
      intermediates.append(None)

  def move_group(group, group_bytes, max_inflight):
    del group_bytes, max_inflight  # Pathways schedules the copies itself
    direct = [i for i in group if intermediates[i] is None]
    moved = dict(zip(direct, pw.reshard(
        [leaves[i] for i in direct], [targets[i] for i in direct],
        donate=donate, cache_resharding_plans=True)))
    for i in group:
      if intermediates[i] is not None:
        moved[i] = pw.sidechannel_reshard_with_intermediate_sharding(
            leaves[i], leaves[i].sharding, targets[i], donate=donate,
            cache_resharding_plans=True)
    return [moved[i] for i in group]

  return move_group


# ------------------------------------------------------------------ two hop


def _plan_two_hop(leaves, targets, donate: bool) -> MoveGroup:
  for x, t in zip(leaves, targets):
    if not (isinstance(x.sharding, NamedSharding) and
            isinstance(t, NamedSharding)):
      raise Unsupported('two_hop moves NamedSharding leaves only')
    if _moves_devices(x, t) and not (x.sharding.is_fully_addressable and
                                     t.is_fully_addressable):
      raise Unsupported('two_hop needs every device it copies to addressable')
    if _reorders(x.sharding, t):
      raise Unsupported('the same devices in another order; device_put '
                        'reorders them')
    two_hop.plan_leaf(x.shape, x.dtype, x.sharding, t)  # compile up front

  def move_group(group, group_bytes, max_inflight):
    out = []
    for i in group:
      rows = two_hop.chunk_rows(leaves[i], targets[i], group_bytes)
      if rows:
        out.append(two_hop.move_in_chunks(
            leaves[i], targets[i], rows, free_source=donate,
            max_inflight=max_inflight))
      else:
        out.append(two_hop.move(leaves[i], targets[i], free_source=donate))
    return out

  return move_group


def compile_relayouts(sources: Sequence[Any], targets: Sequence[Any],
                      runtime: backend.Runtime,
                      group_bytes: int = DEFAULT_GROUP_BYTES
                      ) -> dict[str, list[Any]]:
  """The compiled programs that a run on `runtime` moves `sources`
  (ShapeDtypeStructs with shardings) to `targets` with, from shapes alone,
  for compile-only checks: {'source': those on the source devices,
  'target': those on the destination devices}. The rung is the run's
  (`_chain`): union_jit's select over both sides, then the relayout, when a
  multi-controller job moves weights between processes; otherwise two_hop's
  coarsenings and relayouts, per row chunk for a chunked leaf (they stand in
  for Pathways' own reshard, which compiles nothing here)."""
  union = _chain(runtime, sources, targets)[0] == UNION_JIT
  out = {'source': [], 'target': []}
  for x, t in zip(sources, targets):
    if _reorders(x.sharding, t):
      continue  # moved by device_put: its output is all it allocates
    if union:
      try:
        plan = _plan_union_leaf(tuple(x.shape), x.dtype, x.sharding, t)
      except Unsupported:
        continue  # the run falls through to device_put, as above
      out['source'] += [plan.select]
      out['target'] += [plan.select] + ([plan.relayout] if plan.relayout
                                        else [])
      continue
    rows = two_hop.chunk_rows(x, t, group_bytes)
    shape = (rows,) + tuple(x.shape[1:]) if rows else tuple(x.shape)
    plan = two_hop.plan_leaf(shape, x.dtype, x.sharding, t)
    out['source'] += [plan.coarsen] if plan.coarsen else []
    out['target'] += [plan.relayout] if plan.relayout else []
  return out


# ---------------------------------------------------------------- union jit


@dataclasses.dataclass(frozen=True)
class _UnionPlan:
  """One program over source + destination devices: the source layout is
  stacked with zeros on the destination side, and selecting side 0
  lands every shard on the matching destination device."""

  stacked: NamedSharding  # [2, ...] over ('_side', *source axes)
  select: Any  # compiled a -> a[0], replicated over the sides
  copy_target: NamedSharding  # the source layout on the destination devices
  relayout: Any


@functools.lru_cache(maxsize=4096)
def _plan_union_leaf(shape, dtype, source: NamedSharding,
                     target: NamedSharding) -> _UnionPlan:
  if source.mesh.devices.size != target.mesh.devices.size:
    raise Unsupported('union_jit moves between equal device counts only')
  grid = source.mesh.devices.shape
  destination = np.array(two_hop.devices(target), dtype=object).reshape(grid)
  union = Mesh(np.stack([source.mesh.devices, destination]),
               ('_side',) + source.mesh.axis_names)
  stacked = NamedSharding(union, PartitionSpec('_side', *source.spec))
  select = jax.jit(lambda a: a[0],
                   out_shardings=NamedSharding(union, source.spec)).lower(
                       jax.ShapeDtypeStruct((2, *shape), dtype,
                                            sharding=stacked)).compile()
  copy_target = NamedSharding(Mesh(destination, source.mesh.axis_names),
                              source.spec)
  return _UnionPlan(stacked, select, copy_target,
                    two_hop.final_step(shape, dtype, copy_target, target))


def _stack(x: jax.Array, stacked: NamedSharding) -> jax.Array:
  """[2, ...]: this process's source shards on side 0, zeros on side 1."""
  shape = (2, *x.shape)
  shard_shape = stacked.shard_shape(shape)
  source = {s.device: s.data for s in x.addressable_shards}
  pieces = [jnp.expand_dims(source[d], 0) if d in source else
            jnp.zeros(shard_shape, x.dtype, device=d)
            for d in stacked.addressable_devices_indices_map(shape)]
  return jax.make_array_from_single_device_arrays(shape, stacked, pieces,
                                                  dtype=x.dtype)


def _plan_union(leaves, targets, donate: bool) -> MoveGroup:
  if not all(isinstance(x.sharding, NamedSharding) and
             isinstance(t, NamedSharding) for x, t in zip(leaves, targets)):
    raise Unsupported('union_jit moves NamedSharding leaves only')
  plans = [_plan_union_leaf(x.shape, x.dtype, x.sharding, t)
           for x, t in zip(leaves, targets)]

  def move_group(group, group_bytes, max_inflight):
    del group_bytes, max_inflight  # groups are bounded by _run_groups
    out = []
    for i in group:
      plan, x = plans[i], leaves[i]
      stacked = _stack(x, plan.stacked)
      landed = plan.select(stacked)
      stacked.delete()
      if donate:
        x.delete()
      mine = set(plan.copy_target.addressable_devices)
      copy = jax.make_array_from_single_device_arrays(
          x.shape, plan.copy_target,
          [s.data for s in landed.addressable_shards if s.device in mine],
          dtype=x.dtype)
      out.append(two_hop.finish(copy, plan.relayout, targets[i]))
    return out

  return move_group


# --------------------------------------------------------------- device_put


def _plan_device_put(leaves, targets, donate: bool) -> MoveGroup:
  def move_group(group, group_bytes, max_inflight):
    del group_bytes, max_inflight
    out = jax.device_put([leaves[i] for i in group],
                         [targets[i] for i in group], donate=donate)
    if donate:  # across devices, device_put does not free the source itself
      for i in group:
        if not leaves[i].is_deleted():
          leaves[i].delete()
    return out

  return move_group


_PLANNERS = {
    PATHWAYS: _plan_pathways,
    TWO_HOP: _plan_two_hop,
    UNION_JIT: _plan_union,
    DEVICE_PUT: _plan_device_put,
}
