"""A training step's time, estimated from the programs a compile-only
check compiles (`--compile_topology=... --estimate`).

Each program's work per device comes from its optimized HLO
(`runtime/hlo_cost`: matrix FLOPs, HBM bytes, collectives, loops counted
as often as they run); the chip's roofline from its published figures
(`runtime/topology.Generation`). A program takes the longest of its
compute (FLOPs over the bfloat16 peak), its HBM traffic (bytes over the
HBM bandwidth) and its collectives (each ring moving its share of the
buffer over the links of the torus axes its group spans), which it is
bound by: XLA overlaps collectives with compute, and a matrix unit waits
on memory. A generation splits into its prefill and its decode loop, one
step of which is timed and multiplied by the new tokens (no sample
stopping early). The step runs its phases one after another (a
synchronous RL step), each as often as the plan says
(`plans.Phase.per_step`).

Left out: elementwise work, latency of small collectives and of each
program's launch, traffic between slices (DCN), host work (data,
rewards, Python), and a decode loop's batch shrinking as samples finish.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import math
from typing import Any

from tunix_pw.runtime import hlo_cost, topology

# Bytes each device sends per byte of its buffer, in a ring of n.
_RING = {'all-reduce': lambda n: 2 * (n - 1) / n,
         'all-gather': lambda n: (n - 1) / n,
         'reduce-scatter': lambda n: (n - 1) / n,
         'all-to-all': lambda n: (n - 1) / n,
         'collective-permute': lambda n: 1.0}


@dataclasses.dataclass(frozen=True)
class Roofline:
  """One chip: peak FLOP/s, HBM bytes/s, and the bytes/s it sends in a
  collective spanning every axis of a torus of `shape`."""
  flops: float
  hbm: float
  ici: float
  shape: tuple[int, ...]

  @classmethod
  def of(cls, tpu: topology.TpuType) -> 'Roofline':
    g = tpu.generation
    return cls(g.peak_tflops * 1e12, g.hbm_gbps * 1e9, g.ici_gbps * 1e9,
               tuple(tpu.shape))

  def network_seconds(self, collective: hlo_cost.Collective) -> float:
    n = collective.group
    if n <= 1:
      return 0.0
    longest = max(self.shape)
    axes = min(len(self.shape), math.ceil(math.log(n) / math.log(longest))
               if longest > 1 else 1)
    bandwidth = self.ici * axes / len(self.shape)
    return collective.bytes * _RING[collective.kind](n) / bandwidth

  def seconds(self, cost: hlo_cost.Cost) -> dict[str, float]:
    return dict(compute=cost.flops / self.flops, hbm=cost.hbm_bytes / self.hbm,
                network=sum(self.network_seconds(c) * times
                            for c, times in cost.collectives.items()))


@dataclasses.dataclass
class Row:
  """A phase (or a generation's prefill or decode) per call: its time on
  one device, what bounds it, and its work."""
  name: str
  role: str
  per_step: float
  seconds: float
  bound: str
  flops: float  # per device
  hbm_bytes: float  # per device
  devices: int

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def _row(name: str, role: str, per_step: float, cost: hlo_cost.Cost,
         roofline: Roofline, devices: int) -> Row:
  times = roofline.seconds(cost)
  bound = max(times, key=times.get)
  return Row(name, role, per_step, times[bound], bound, cost.flops,
             cost.hbm_bytes, devices)


def rows(phase: Any, programs: Sequence[Any], roofline: Roofline,
         devices: int) -> list[Row]:
  """A phase's rows: one, or a generation's prefill and decode."""
  cost = hlo_cost.Cost()
  for compiled in programs[:phase.timed]:
    cost.add(hlo_cost.of(compiled))
  if not (phase.decode_steps and cost.loops):
    return [_row(phase.name, phase.role, phase.per_step, cost, roofline,
                 devices)]
  decode = hlo_cost.Cost()
  for loop in cost.loops:
    decode.add(loop)
  prefill = hlo_cost.Cost()
  prefill.add(cost)
  prefill.add(decode, -1)
  steps = phase.decode_steps
  per_token = _row(f'{phase.name} decode', phase.role, phase.per_step, decode,
                   roofline, devices)
  per_token.seconds *= steps
  per_token.flops *= steps
  per_token.hbm_bytes *= steps
  return [_row(f'{phase.name} prefill', phase.role, phase.per_step, prefill,
               roofline, devices), per_token]


def step(all_rows: Sequence[Row], roofline: Roofline, chips: int,
         tokens: int) -> dict[str, float]:
  """The step's time (its phases in turn), tokens/s and MFU (the matrix
  FLOPs of every phase over the chips' peak for that time)."""
  timed = [r for r in all_rows if r.per_step]
  seconds = sum(r.seconds * r.per_step for r in timed)
  flops = sum(r.flops * r.devices * r.per_step for r in timed)
  return dict(seconds=seconds, tokens_per_s=tokens / seconds if seconds
              else 0.0,
              mfu=flops / (chips * roofline.flops * seconds) if seconds
              else 0.0)


def report(all_rows: Sequence[Row], total: dict[str, float]) -> str:
  """The table a compile-only check prints."""
  lines = ['estimated step (per call on one device; phases in turn):']
  for r in all_rows:
    share = (r.seconds * r.per_step / total['seconds']
             if total['seconds'] else 0.0)
    lines.append(
        f'  {r.name:<34} {r.seconds * 1e3:>10.2f} ms x {r.per_step:g}'
        f'  {r.bound:<7} {r.flops / 1e12:>9.2f} TFLOP'
        + (f'  {share:.0%} of the step' if r.per_step else
           '  (not in a step)'))
  lines.append(f'  step {total["seconds"]:.2f} s, '
               f'{total["tokens_per_s"]:,.0f} tokens/s, '
               f'MFU {total["mfu"]:.1%}')
  return '\n'.join(lines)
