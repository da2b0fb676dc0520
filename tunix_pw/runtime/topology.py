"""TPU types by XPK's names, and their devices as topology descriptions.

XPK (and GKE) name a slice `<generation>-<size>`: v4-N and v5p-N count
TensorCores (two per chip), v5litepod-N and v6e-N count chips. With libtpu
installed, `devices` returns every device of such a slice (times
`num_slices`) as a description to ahead-of-time compile against, on a
machine without a TPU.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from tunix_pw.errors import UsageError

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Generation:
  """A TPU generation, with its published per-chip figures
  (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e)."""
  jax_name: str  # the prefix of jax's topology names
  cores_per_chip: int  # in the size of XPK's name
  hbm_gib: int  # per chip
  dims: int  # 3: twisted-torus cubes (v4, v5p); 2: v5e / v6e grids
  max_chips: int  # in one slice
  peak_tflops: float  # bfloat16
  hbm_gbps: float  # HBM bandwidth, GB/s
  # GB/s a chip sends in an all-reduce over the whole torus: half its
  # bidirectional ICI bandwidth (v4: the pod's all-reduce bandwidth over
  # its 4,096 chips).
  ici_gbps: float


GENERATIONS = {
    'v4': Generation('v4', 2, 32, 3, 4096, 275, 1200, 1.1e6 / 4096),
    'v5p': Generation('v5p', 2, 95, 3, 4096, 459, 2765, 1200 / 2),
    'v5litepod': Generation('v5e', 1, 16, 2, 256, 197, 819, 400 / 2),
    'v6e': Generation('v6e', 1, 32, 2, 256, 918, 1638, 800 / 2),
}
_NAME = re.compile(r'^([a-z0-9]+)-(\d+)$')


@dataclasses.dataclass(frozen=True)
class TpuType:
  name: str  # XPK's, e.g. 'v5p-128'
  generation: Generation
  chips: int  # per slice

  @property
  def hbm_bytes(self) -> int:
    """HBM of one chip."""
    return self.generation.hbm_gib * GIB

  @property
  def topology(self) -> str:
    """jax's topology name: 'v5p:4x4x4' for v5p-128."""
    return f'{self.generation.jax_name}:{"x".join(map(str, self.shape))}'

  @property
  def shape(self) -> list[int]:
    """Chips along each axis of the slice's torus (or grid)."""
    exponent = self.chips.bit_length() - 1
    dims = [1] * self.generation.dims
    for _ in range(exponent):  # each doubling goes to the smallest axis
      smallest = min(dims)
      last = max(i for i, d in enumerate(dims) if d == smallest)
      dims[last] *= 2
    if self.generation.dims == 3 and self.chips == 4:
      dims = [2, 2, 1]  # the one cube smaller than a host's 2x2x2
    return dims


def parse(name: str, field: str = 'tpu_type') -> TpuType:
  """'v5p-128' -> TpuType; anything else is a one-sentence UsageError."""
  match = _NAME.match(name or '')
  generation = GENERATIONS.get(match.group(1)) if match else None
  if generation is None:
    raise UsageError(
        f'{field}={name!r} is not a TPU type XPK knows; use '
        f'<generation>-<size> with generation one of '
        f'{", ".join(GENERATIONS)} (e.g. v5p-128, v5litepod-16, v6e-256).')
  size = int(match.group(2))
  chips = size // generation.cores_per_chip
  smallest = 4
  if (size % generation.cores_per_chip or chips < smallest or
      chips > generation.max_chips or chips & (chips - 1)):
    low, high = (c * generation.cores_per_chip
                 for c in (smallest, generation.max_chips))
    raise UsageError(
        f'{field}={name!r} is not a slice size supported here; '
        f'{match.group(1)} sizes are powers of two from {low} to {high}.')
  return TpuType(name, generation, chips)


def devices(tpu: TpuType, num_slices: int = 1) -> list[Any]:
  """Descriptions of every device of `num_slices` slices of `tpu`."""
  if num_slices < 1:
    raise UsageError(f'--compile_num_slices={num_slices} must be at least 1.')
  # Another process (a test run, a second check) may hold libtpu: these are
  # descriptions only, so sharing it is safe.
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    description = topologies.get_topology_desc(
        platform='tpu', topology_name=tpu.topology, num_slices=num_slices)
  except Exception as e:  # pylint: disable=broad-exception-caught
    raise UsageError(
        f'no topology description for {tpu.name} ({tpu.topology}): '
        f'{type(e).__name__}: {str(e).splitlines()[0]}; compile-only checks '
        "need libtpu (pip install 'tunix_pw[tpu]').") from None
  return list(description.devices)
