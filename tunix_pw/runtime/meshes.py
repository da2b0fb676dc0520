"""Role -> Mesh from config.

A role (actor, reference, rollout, critic) names mesh axes and a device
selection. Roles on the same devices are collocated; roles on disjoint devices
are disaggregated. `build` also returns the union mesh over every device any
role uses, for computations that span roles.

Config block (see `configs/common.py:meshes`):

  layout   'collocated' (every role on the same devices) or 'disaggregated'
           (roles with their own devices must not overlap)
  <role>.axes     'fsdp=4,tp=2'; one size may be -1 (fills the devices)
  <role>.devices  'all' | 'a:b' (indices in device id order, in which each
                  host's and each slice's devices are contiguous) |
                  'a%:b%' (fractions) | 'slices:a:b' (whole slices) |
                  another role's name (share its devices)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
import logging
import math
import re
from typing import Any

from jax.experimental import mesh_utils
from jax.sharding import Mesh
import numpy as np

from tunix_pw.errors import UsageError

LAYOUTS = ('collocated', 'disaggregated')
UNION_AXIS = 'union'
_AXIS = re.compile(r'^([A-Za-z_]\w*)=(-?\d+)$')
SEQUENCE = 'sequence'  # the axis that splits tokens (sequence parallelism)
STAGE = 'stage'  # the axis that splits layers (pipeline parallelism)
_RANGE = re.compile(r'^(\d*)(%?):(\d*)(%?)$')
_SLICES = re.compile(r'^slices:(\d+):(\d+)$')


@dataclasses.dataclass(frozen=True)
class RoleMeshes:
  """The job's meshes by role, plus the union over all of their devices."""

  layout: str
  by_role: Mapping[str, Mesh]
  union: Mesh

  def __getitem__(self, role: str) -> Mesh:
    return self.by_role[role]

  def describe(self) -> str:
    return ', '.join(
        f'{role} {dict(mesh.shape)} on {_span(mesh)}'
        for role, mesh in self.by_role.items())


def _span(mesh: Mesh) -> str:
  ids = sorted(d.id for d in mesh.devices.flat)
  return f'{len(ids)} devices (ids {ids[0]}..{ids[-1]})'


def parse_axes(spec: str, field: str) -> tuple[tuple[str, int], ...]:
  """'fsdp=4,tp=-1' -> (('fsdp', 4), ('tp', -1)); bad input is a UsageError."""
  axes = []
  for part in (p.strip() for p in spec.split(',')):
    match = _AXIS.match(part)
    if not match:
      raise UsageError(f'{field}={spec!r} is not of the form '
                       "'name=size,name=size' (e.g. 'fsdp=4,tp=2').")
    name, size = match.group(1), int(match.group(2))
    if size == 0 or size < -1:
      raise UsageError(f'{field}: axis {name!r} has size {size}; sizes are '
                       'positive, or -1 for one axis that fills the devices.')
    if name in dict(axes):
      raise UsageError(f'{field}: axis {name!r} appears twice.')
    axes.append((name, size))
  if sum(size == -1 for _, size in axes) > 1:
    raise UsageError(f'{field}={spec!r} has more than one -1 axis; at most one '
                     'axis may fill the devices.')
  return tuple(axes)


def _roles(config: Any) -> dict[str, Any]:
  return {k: v for k, v in config.items() if k != 'layout'}


def check(config: Any, prefix: str = '--config.meshes', rules: Any = None,
          divides: Mapping[str, Mapping[str, int]] | None = None) -> None:
  """Static checks of a meshes block: syntax only, no devices needed;
  with the sharding `rules`, every axis wider than 1 is one they use (an
  axis nothing splits over would only replicate); an axis named in
  `divides` (axis -> what -> count: a `sequence` axis the token lengths,
  a `stage` axis the repeated layer blocks) divides each count, or it
  would silently split nothing."""
  if config.layout not in LAYOUTS:
    raise UsageError(f'{prefix}.layout={config.layout!r} is unknown; use one '
                     f'of {", ".join(LAYOUTS)}.')
  roles = _roles(config)
  used = {a for axes in (rules or {}).values() for a in axes.split(',')}
  for role, spec in roles.items():
    for name, size in parse_axes(spec.axes, f'{prefix}.{role}.axes'):
      for what, count in (divides or {}).get(name, {}).items():
        if size > 1 and count % size:
          raise UsageError(
              f'{prefix}.{role}.axes splits {what} {size} ways, which does '
              f'not divide it ({count}); use a {name} size that divides '
              f'{count}.')
      if rules is not None and size != 1 and name not in used:
        raise UsageError(
            f'{prefix}.{role}.axes names the mesh axis {name!r}, which no '
            '--config.sharding rule splits anything over; use one the rules '
            f'name ({", ".join(sorted(used - {""}))}) or add it to a rule.')
    devices = spec.devices
    if devices in roles:
      if roles[devices].devices in roles:
        raise UsageError(f'{prefix}.{role}.devices={devices!r} names a role '
                         'that itself shares devices; name the owner role.')
    elif not (devices == 'all' or _RANGE.match(devices) or
              _SLICES.match(devices)):
      raise UsageError(
          f"{prefix}.{role}.devices={devices!r} is not 'all', 'a:b', "
          f"'a%:b%', 'slices:a:b' or a role name ({', '.join(roles)}).")


def _select(spec: str, devices: Sequence[Any], field: str) -> list[Any]:
  """The devices a (non-role) device spec selects, in `devices` order."""
  n = len(devices)
  if spec == 'all':
    return list(devices)
  if match := _SLICES.match(spec):
    first, stop = int(match.group(1)), int(match.group(2))
    chosen = [d for d in devices
              if first <= (getattr(d, 'slice_index', 0) or 0) < stop]
    if not chosen:
      raise UsageError(f'{field}={spec!r} selects no devices: the job has '
                       'no slice in that range.')
    return chosen
  start_s, start_pct, stop_s, stop_pct = _RANGE.match(spec).groups()
  start = int(start_s or 0)
  stop = int(stop_s) if stop_s else (100 if stop_pct else n)
  start = n * start // 100 if start_pct else start
  stop = n * stop // 100 if stop_pct else stop
  if not 0 <= start < stop <= n:
    raise UsageError(f'{field}={spec!r} selects devices {start}..{stop - 1} '
                     f'but the job has {n} devices (0..{n - 1}).')
  return list(devices[start:stop])


def _shape(axes: tuple[tuple[str, int], ...], count: int,
           field: str, devices_field: str) -> tuple[int, ...]:
  known = math.prod(size for _, size in axes if size != -1)
  sizes = [size if size != -1 else count // known for _, size in axes]
  if math.prod(sizes) != count or 0 in sizes:
    spec = ','.join(f'{name}={size}' for name, size in axes)
    raise UsageError(f'{field}={spec!r} needs {known} devices (or a multiple, '
                     f'with -1) but {devices_field} selects {count}; make the '
                     'axis sizes multiply to the device count.')
  return tuple(sizes)


def _device_grid(shape: tuple[int, ...], devices: list[Any]) -> np.ndarray:
  """Devices arranged for `shape`, topology-aware on TPU."""
  if devices[0].platform == 'tpu':
    num_slices = len({getattr(d, 'slice_index', 0) or 0 for d in devices})
    try:
      if num_slices > 1 and shape[0] % num_slices == 0:
        # Slices meet over DCN on the outermost (data-parallel) axis.
        ici = (shape[0] // num_slices,) + shape[1:]
        dcn = (num_slices,) + (1,) * (len(shape) - 1)
        return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
      return mesh_utils.create_device_mesh(shape, devices,
                                           allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError) as e:
      logging.warning('no topology-aware order for %s (%s); using id order',
                      shape, e)
  return np.array(devices, dtype=object).reshape(shape)


def select(config: Any, devices: Sequence[Any],
           prefix: str = '--config.meshes') -> dict[str, list[Any]]:
  """Each role's devices (objects with `id` and, on TPU, `slice_index`)."""
  roles = _roles(config)
  # Id order keeps a range on whole hosts (jax.devices() order may not: on
  # TPU it runs along the torus, across hosts).
  ordered = sorted(devices, key=lambda d: (getattr(d, 'slice_index', 0) or 0,
                                           d.id))
  selected = {role: _select(spec.devices, ordered, f'{prefix}.{role}.devices')
              for role, spec in roles.items() if spec.devices not in roles}
  return {role: selected[spec.devices if spec.devices in roles else role]
          for role, spec in roles.items()}


def build(config: Any, devices: Sequence[Any],
          prefix: str = '--config.meshes') -> RoleMeshes:
  """Topology checks and mesh construction for every role of the config."""
  check(config, prefix)
  roles = _roles(config)
  selected = select(config, devices, prefix)
  owners = [r for r, s in roles.items() if s.devices not in roles]
  if config.layout == 'disaggregated':
    seen = {}
    for role in owners:
      for d in selected[role]:
        if d.id in seen:
          raise UsageError(
              f'{prefix}.{role}.devices={roles[role].devices!r} overlaps '
              f'{prefix}.{seen[d.id]}.devices={roles[seen[d.id]].devices!r} '
              f'(device id {d.id}) but layout is disaggregated; give them '
              "disjoint devices, or set layout='collocated'.")
        seen[d.id] = role
  else:
    first = owners[0]
    for role in owners[1:]:
      if {d.id for d in selected[role]} != {d.id for d in selected[first]}:
        raise UsageError(
            f'{prefix}.{role}.devices={roles[role].devices!r} differs from '
            f'{prefix}.{first}.devices={roles[first].devices!r} but layout is '
            "collocated; give them the same devices, or set "
            "layout='disaggregated'.")

  by_role = {}
  for role, spec in roles.items():
    axes = parse_axes(spec.axes, f'{prefix}.{role}.axes')
    shape = _shape(axes, len(selected[role]), f'{prefix}.{role}.axes',
                   f'{prefix}.{role}.devices={spec.devices!r}')
    by_role[role] = Mesh(_device_grid(shape, selected[role]),
                         tuple(name for name, _ in axes))

  used = {d.id for devs in selected.values() for d in devs}
  union = Mesh(np.array([d for d in devices if d.id in used], dtype=object),
               (UNION_AXIS,))
  return RoleMeshes(config.layout, by_role, union)


def check_batch(batch_size: int, config: Any, role: str, batch_rule: str,
                field: str = '--config.batch_size') -> None:
  """Static check: a batch divides over the data-parallel shards that the
  role's mesh axes give the 'batch' rule (sizes known before devices)."""
  axes = parse_axes(config[role].axes, f'--config.meshes.{role}.axes')
  shards = math.prod(size for name, size in axes
                     if name in batch_rule.split(',') and size > 0)
  if batch_size % shards:
    raise UsageError(f'{field}={batch_size} does not divide over the '
                     f'{shards} data-parallel shards of --config.meshes.'
                     f'{role}.axes={config[role].axes!r}; use a multiple of '
                     f'{shards}.')
