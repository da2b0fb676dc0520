"""Logical axis names -> PartitionSpecs on a role's mesh, by config rules.

Model code names logical axes only ('batch', 'embed', 'mlp', 'heads', ...);
the config maps each to mesh axes (`--config.sharding.mlp=tp`). A mesh axis
that the mesh lacks, that has size 1, or that does not divide the dimension is
dropped, so one KV head under tp=4 is replicated by rule rather than an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
import math
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Rules = Mapping[str, str]  # logical axis -> 'mesh_axis[,mesh_axis...]'


def spec(shape: Sequence[int], logical_axes: Sequence[str | None],
         mesh: Mesh, rules: Rules) -> PartitionSpec:
  """The PartitionSpec for one array of `shape` with named logical axes."""
  if len(shape) != len(logical_axes):
    raise ValueError(f'shape {tuple(shape)} has {len(shape)} dims but logical '
                     f'axes {tuple(logical_axes)} name {len(logical_axes)}')
  used = set()
  parts = []
  for dim, logical in zip(shape, logical_axes):
    axes = [a for a in (rules.get(logical, '') if logical else '').split(',')
            if a and mesh.shape.get(a, 1) > 1 and a not in used]
    while axes and dim % math.prod(mesh.shape[a] for a in axes):
      axes.pop()  # drop the innermost axis until the size divides
    used.update(axes)
    parts.append(None if not axes else axes[0] if len(axes) == 1
                 else tuple(axes))
  return PartitionSpec(*parts)


def named(mesh: Mesh, shape: Sequence[int],
          logical_axes: Sequence[str | None], rules: Rules) -> NamedSharding:
  return NamedSharding(mesh, spec(shape, logical_axes, mesh, rules))


def batch(mesh: Mesh, shape: Sequence[int], rules: Rules) -> NamedSharding:
  """Rows over the mesh's batch axes, every other dimension whole."""
  return named(mesh, shape, ('batch',) + (None,) * (len(shape) - 1), rules)


def tree_shardings(mesh: Mesh, shapes: object, logical: object,
                   rules: Rules) -> object:
  """Shardings for a pytree of shapes (anything with .shape) and a matching
  pytree of logical-axis tuples."""
  return jax.tree.map(lambda x, axes: named(mesh, x.shape, axes, rules),
                      shapes, logical)


@dataclasses.dataclass(frozen=True)
class Sharder:
  """Constrains activations to logical axes on a mesh; a no-op without one."""

  mesh: Mesh | None = None
  rules: Any = None

  def __call__(self, x: jax.Array, *axes: str | None) -> jax.Array:
    if self.mesh is None:
      return x
    return jax.lax.with_sharding_constraint(
        x, named(self.mesh, x.shape, axes, self.rules))

  def axes(self, logical: str) -> tuple[str, ...]:
    """The mesh axes wider than 1 that the rules split `logical` over."""
    if self.mesh is None:
      return ()
    return tuple(a for a in (self.rules.get(logical) or '').split(',')
                 if self.mesh.shape.get(a, 1) > 1)

  def within(self, logical: str) -> Sharder:
    """This sharder for what runs inside one part of `logical` (a
    pipeline stage): the other rules without its mesh axes."""
    mine = set(self.axes(logical))
    return Sharder(self.mesh, {
        name: ','.join(a for a in axes.split(',') if a not in mine)
        for name, axes in self.rules.items()})

  def ways(self, logical: str) -> int:
    """How many parts those axes split a dimension named `logical` in."""
    return math.prod(self.mesh.shape[a] for a in self.axes(logical))
