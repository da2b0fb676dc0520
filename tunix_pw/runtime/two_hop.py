"""The single-controller transfer: a same-layout copy, then a relayout.

Per leaf: (1) when the source spans more devices than the destination, a
coarsening on the source mesh to one shard per destination device (a real
intermediate: neighbours pool their shards, never a full all-gather);
(2) a same-layout copy of each shard onto the destination devices, a plain
device-to-device copy; (3) a jitted relayout on the destination mesh. Inputs
that are ours are deleted right after the dispatch that reads them (PJRT
frees them once read), so each leaf's extra memory is one staging copy.

A leaf larger than the group budget whose leading dimension is unsharded on
both sides (scan-stacked layers) moves in row chunks written in place into
its preallocated target, so no staging copy is ever larger than the budget.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np

from tunix_pw.runtime.throttle import InflightThrottler

# A leaf this small may use a replicated intermediate when no dimension
# divides the destination's device count (norms, biases, scalars).
SMALL_LEAF_BYTES = 1 << 20


class Unsupported(Exception):
  """This path cannot plan the transfer; the next one in the chain is tried."""


def devices(sharding: NamedSharding) -> list[Any]:
  return list(sharding.mesh.devices.flat)


def compiled_relayout(shape, dtype, source, target):
  # jnp.copy keeps this a real computation with its own output (an identity
  # could be forwarded), so deleting the input after dispatch is safe.
  fn = jax.jit(jnp.copy, out_shardings=target)
  return fn.lower(jax.ShapeDtypeStruct(shape, dtype, sharding=source)).compile()


def final_step(shape, dtype, source, target):
  """The relayout of a staging copy onto `target`, or None when the copy is
  laid out that way already (it is then renamed, not copied)."""
  if source.is_equivalent_to(target, len(shape)):
    return None
  return compiled_relayout(shape, dtype, source, target)


def finish(staged: jax.Array, relayout: Any, target: NamedSharding):
  """Our staging copy onto `target`, freed once the relayout has read it."""
  if relayout is None:
    return jax.make_array_from_single_device_arrays(
        staged.shape, target, [s.data for s in staged.addressable_shards],
        dtype=staged.dtype)
  out = relayout(staged)
  staged.delete()
  return out


@dataclasses.dataclass(frozen=True)
class LeafPlan:
  """How one leaf moves; `copy_target` is None when the devices are the same
  (then `relayout` is the whole move)."""

  coarsen: Any = None  # compiled source-mesh relayout, or None
  copy_source: NamedSharding | None = None  # whose shards are copied
  copy_target: NamedSharding | None = None  # the same layout, destination
  relayout: Any = None  # compiled, or None for a rename


def _coarsened(source: NamedSharding, target: NamedSharding, shape, nbytes):
  """A layout on the source devices with one shard per target device,
  replicated over the rest, and its replica axes. pathwaysutils' intermediate
  is used where it is a real one; a fully replicated one never is."""
  from pathwaysutils import reshard as pw  # pylint: disable=g-import-not-at-top
  try:
    intermediate, replica_axes = pw.find_intermediate_sharding(source, target)
    if not intermediate.is_fully_replicated:
      return intermediate, tuple(replica_axes)
  except pw.NoIntermediateShardingError:
    pass
  n, m = source.mesh.devices.size, target.mesh.devices.size
  # Neighbouring source devices (in mesh order) pool their shards: an
  # all-gather within groups of n // m, never across the whole mesh.
  mesh = Mesh(source.mesh.devices.reshape(m, n // m), ('_split', '_replica'))

  def sharded_dims(spec):
    return [d for d, axes in enumerate(spec) if axes is not None]

  for d in (sharded_dims(source.spec) + sharded_dims(target.spec) +
            list(range(len(shape)))):
    if shape[d] % m == 0:
      spec = [None] * len(shape)
      spec[d] = '_split'
      return NamedSharding(mesh, PartitionSpec(*spec)), ('_replica',)
  if nbytes > SMALL_LEAF_BYTES:
    raise Unsupported(f'no dimension of {shape} divides over {m} devices')
  return NamedSharding(mesh, PartitionSpec()), ('_replica',)


def _replica_view(sharding: NamedSharding, replica_axes: Sequence[str]):
  """The first replica of `sharding` (index 0 on every replica axis), as a
  sharding over the remaining axes."""
  mesh = sharding.mesh
  index = tuple(0 if a in replica_axes else slice(None)
                for a in mesh.axis_names)
  return NamedSharding(
      Mesh(mesh.devices[index],
           tuple(a for a in mesh.axis_names if a not in replica_axes)),
      sharding.spec)


@functools.lru_cache(maxsize=4096)
def plan_leaf(shape, dtype, source: NamedSharding,
              target: NamedSharding) -> LeafPlan:
  """The compiled plan for one (shape, dtype, source, target)."""
  if source.device_set == target.device_set:
    return LeafPlan(relayout=compiled_relayout(shape, dtype, source, target))
  n, m = source.mesh.devices.size, target.mesh.devices.size
  if max(n, m) % min(n, m):
    raise Unsupported(f'{n} source and {m} target devices do not divide')
  if n < m:  # each source shard lands on m // n target devices
    mesh = Mesh(target.mesh.devices.reshape((m // n,) +
                                            source.mesh.devices.shape),
                ('_replica',) + source.mesh.axis_names)
    copy_target = NamedSharding(mesh, source.spec)
    return LeafPlan(None, source, copy_target,
                    final_step(shape, dtype, copy_target, target))
  coarsen, copy_source = None, source
  if n > m:
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    intermediate, replica_axes = _coarsened(source, target, shape, nbytes)
    coarsen = compiled_relayout(shape, dtype, source, intermediate)
    copy_source = _replica_view(intermediate, replica_axes)
  copy_mesh = Mesh(np.array(devices(target), dtype=object).reshape(
      copy_source.mesh.devices.shape), copy_source.mesh.axis_names)
  copy_target = NamedSharding(copy_mesh, copy_source.spec)
  return LeafPlan(coarsen, copy_source, copy_target,
                  final_step(shape, dtype, copy_target, target))


def _index_key(index: tuple[slice, ...]) -> tuple[Any, ...]:
  return tuple((s.start, s.stop) for s in index)


def _copy_shards(x: jax.Array, target: NamedSharding) -> jax.Array:
  """Each target device gets the shard of `x` covering the same index: pure
  device-to-device copies, also when the target repeats the layout.
  may_alias=False: a shard already on its device is copied all the same,
  since the source may be deleted next."""
  if target.mesh.devices.size == len(x.sharding.device_set):
    return jax.device_put(x, target, may_alias=False)
  by_index = {_index_key(s.index): s.data for s in x.addressable_shards}
  indices = target.addressable_devices_indices_map(x.shape)
  copies = jax.device_put([by_index[_index_key(i)] for i in indices.values()],
                          list(indices), may_alias=False)
  return jax.make_array_from_single_device_arrays(x.shape, target, copies)


def stage(x: jax.Array, plan: LeafPlan) -> jax.Array:
  """Dispatches the coarsening (if any) and the copy onto the destination."""
  if plan.coarsen is None:
    return _copy_shards(x, plan.copy_target)
  coarse = plan.coarsen(x)
  shards = {s.device: s.data for s in coarse.addressable_shards}
  first = jax.make_array_from_single_device_arrays(
      x.shape, plan.copy_source,
      [shards[d] for d in devices(plan.copy_source)])
  staged = _copy_shards(first, plan.copy_target)
  coarse.delete()
  return staged


def move(x: jax.Array, target: NamedSharding, *, free_source: bool):
  """One leaf, whole: stage, then finish. Frees `x` when asked."""
  plan = plan_leaf(x.shape, x.dtype, x.sharding, target)
  if plan.copy_target is None:
    out = plan.relayout(x)
  else:
    out = finish(stage(x, plan), plan.relayout, target)
  if free_source:
    x.delete()
  return out


def chunk_rows(x: Any, target: NamedSharding,
               budget: int) -> int | None:
  """Rows per chunk for a leaf (an array or a ShapeDtypeStruct with its
  sharding) over budget that can move in row chunks."""
  nbytes = math.prod(x.shape) * np.dtype(x.dtype).itemsize
  if nbytes <= budget or len(x.shape) < 2 or x.shape[0] < 2:
    return None
  specs = (x.sharding.spec, target.spec)
  if any(len(spec) and spec[0] is not None for spec in specs):
    return None
  row = nbytes // x.shape[0]
  fits = [r for r in range(1, x.shape[0]) if x.shape[0] % r == 0]
  return max([r for r in fits if r * row <= budget] or [1])


@functools.lru_cache(maxsize=1024)
def _chunk_fns(shape, dtype, rows, source: NamedSharding,
               target: NamedSharding):
  """Compiled pieces of a chunked move: a zero target, a row slice on the
  source mesh, and the in-place write of a staged chunk (which relayouts)."""
  piece_shape = (rows,) + tuple(shape[1:])
  zeros = jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=target)
  piece_source = NamedSharding(source.mesh, source.spec)
  take = jax.jit(
      lambda x, i: jax.lax.dynamic_slice_in_dim(x, i, rows, 0),
      out_shardings=piece_source)
  plan = plan_leaf(piece_shape, dtype, piece_source,
                   NamedSharding(target.mesh, target.spec))
  write = jax.jit(
      lambda out, piece, i: (
          jax.lax.dynamic_update_slice_in_dim(out, piece, i, 0),
          jnp.zeros((), jnp.int32)),  # a marker that the write is done
      donate_argnums=0, out_shardings=(target, None))
  return zeros, take, plan, write


def move_in_chunks(x: jax.Array, target: NamedSharding, rows: int, *,
                   free_source: bool, max_inflight: int) -> jax.Array:
  """A leaf moved `rows` rows at a time into its preallocated target."""
  zeros, take, plan, write = _chunk_fns(x.shape, x.dtype, rows, x.sharding,
                                        target)
  out = zeros()
  throttler = InflightThrottler(max_inflight)
  for start in range(0, x.shape[0], rows):
    piece = take(x, start)
    if plan.copy_target is not None:
      staged = stage(piece, plan)
      piece.delete()
      piece = staged
    out, done = write(out, piece, start)
    piece.delete()
    throttler.add(done)  # bounds the chunks whose staging is alive
  if free_source:
    x.delete()
  return out
