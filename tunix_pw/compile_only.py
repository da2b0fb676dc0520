"""Compile-only checks: does a job fit a TPU slice, before it queues for one.

  python -m tunix_pw.main --config=tunix_pw/configs/grpo.py:gemma2-9b \
      --compile_topology=v5p-512 [--compile_num_slices=2]

The role meshes are built on topology descriptions of the slice (libtpu, no
TPU needed); the job's own jitted functions are compiled ahead of time from
shapes alone (a job module offers them as `compile_plan(config, meshes)`);
XLA's memory analysis of each program gives its temporaries. Per device, the
peak is the resident state of every role placed there (parameters, optimizer
state, reference, rollout copy) plus the largest phase (a program's arguments,
outputs and temporaries beyond that state: the sampler's KV cache, the
incoming weights of a sync, activations), against the chip's HBM.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import re
import time
from typing import Any

import jax

from tunix_pw import estimate, workdir as workdir_lib
from tunix_pw.errors import UsageError
from tunix_pw.runtime import backend, meshes as meshes_lib, topology
from tunix_pw.train import plans
from tunix_pw.train.plans import size

@dataclasses.dataclass
class _Measured:
  phase: plans.Phase
  transient: int  # bytes per device beyond the resident state
  temp: int
  seconds: float
  programs: int
  note: str
  rows: list[Any] = dataclasses.field(default_factory=list)  # estimates


_OUT_OF_HBM = re.compile(r'temporaries \(([\d.]+)([KMGT]?)\) exceeds')


def _measure(phase: plans.Phase, roofline: estimate.Roofline | None = None,
             devices: int = 0) -> _Measured:
  """Compiles the phase and sizes it (and with `roofline`, estimates its
  time on `devices`). A program whose temporaries alone exceed the HBM
  fails to compile; the compiler's figure is then the phase's (a lower
  bound: arguments not counted)."""
  start = time.perf_counter()
  note = phase.note()
  try:
    programs = list(phase.compile())
  except jax.errors.JaxRuntimeError as e:
    match = _OUT_OF_HBM.search(str(e))
    if 'RESOURCE_EXHAUSTED' not in str(e) or not match:
      raise
    temp = int(float(match.group(1)) *
               1024 ** ' KMGT'.index(match.group(2) or ' '))
    return _Measured(phase, temp, temp, time.perf_counter() - start, 0,
                     ', '.join(filter(None, [note, 'out of HBM while '
                                             'compiling'])))
  seconds = time.perf_counter() - start
  biggest, temp = 0, 0
  for compiled in programs:
    m = compiled.memory_analysis()
    size = (m.argument_size_in_bytes + m.output_size_in_bytes -
            m.alias_size_in_bytes + m.temp_size_in_bytes)
    biggest, temp = max(biggest, size), max(temp, m.temp_size_in_bytes)
  transient = max(phase.held + phase.inflight * biggest - phase.resident_args,
                  0)
  return _Measured(phase, transient, temp, seconds, len(programs), note,
                   estimate.rows(phase, programs, roofline, devices)
                   if roofline and programs else [])




def _span(ids: Sequence[int]) -> str:
  return f'{min(ids)}..{max(ids)} ({len(ids)})'


def _check_slice_0(meshes: meshes_lib.RoleMeshes) -> None:
  """libtpu (0.0.42 to 0.0.50, tests/test_compile_only) compiles no
  program without slice 0's devices: a role off slice 0 is refused."""
  for role, mesh in meshes.by_role.items():
    slices = {getattr(d, 'slice_index', 0) or 0 for d in mesh.devices.flat}
    if 0 not in slices:
      raise UsageError(
          f'--compile_topology: the {role} role is on slices '
          f'{sorted(slices)} only, and libtpu cannot compile a program '
          "without slice 0's devices (\"Slice is empty\"); check a layout "
          'whose roles each include slice 0 (e.g. on one slice, or '
          '--config.meshes.layout=collocated).')


def _device_groups(meshes: Any, plan: Any, measured: list[Any],
                   hbm: int) -> list[dict[str, Any]]:
  """One row per group of devices holding the same roles: what stays
  resident there, each phase's transient memory and the peak (resident plus
  the largest phase); each printed as it is made."""
  roles_of = {}
  for role, mesh in meshes.by_role.items():
    for d in mesh.devices.flat:
      roles_of.setdefault(d.id, []).append(role)
  groups = {}
  for device_id, roles in roles_of.items():
    groups.setdefault(tuple(roles), []).append(device_id)

  rows = []
  for roles, ids in groups.items():
    resident = {item: size for role in roles
                for item, size in plan.resident.get(role, {}).items()}
    phases = [m for m in measured if m.phase.role in roles]
    largest = max(phases, key=lambda m: m.transient, default=None)
    peak = sum(resident.values()) + (largest.transient if largest else 0)
    row = dict(devices=sorted(ids), roles=list(roles), resident=resident,
               phases={m.phase.name: m.transient for m in phases},
               largest_phase=largest.phase.name if largest else None,
               peak=peak, hbm=hbm)
    rows.append(row)
    print(f'devices {_span(ids)}: {", ".join(roles)}\n'
          '  resident  ' + (' + '.join(f'{k} {size(v)}'
                                       for k, v in resident.items()) or '-') +
          f' = {size(sum(resident.values()))}\n'
          '  phases    ' + ' | '.join(
              f'{m.phase.name} {size(m.transient)}' +
              (f' ({m.note})' if m.note else '') for m in phases) + '\n'
          f'  peak      {size(peak)} of {size(hbm)} HBM ({peak / hbm:.0%})' +
          (f', largest phase: {largest.phase.name}' if largest else ''),
          flush=True)
  return rows


def report(config: Any, job: Any, tpu_type: str, num_slices: int,
           backend_name: str = backend.PATHWAYS,
           with_estimate: bool = False) -> dict[str, Any]:
  """Compiles `job`'s programs for the slice as a job on `backend_name`
  (Pathways or multi-controller: the weight sync's programs differ) would
  run them, prints the per-device report (`with_estimate`: and the step's
  estimated time, `estimate.py`) and returns it."""
  if not hasattr(job, 'compile_plan'):
    raise UsageError(f'--compile_topology: the {config.job} job has no '
                     'compile plan; compile-only checks cover the sft, dpo, '
                     'reward_model, distill, grpo, agentic and ppo jobs.')
  tpu = topology.parse(tpu_type, '--compile_topology')
  devices = topology.devices(tpu, num_slices)
  processes = (1 if backend_name == backend.PATHWAYS else
               len({d.process_index for d in devices}))
  runtime = backend.Runtime(backend_name, f'compile only: {num_slices} x '
                            f'{tpu.name} topology descriptions', 0, processes,
                            tuple(devices))
  meshes = meshes_lib.build(config.meshes, runtime.devices)
  _check_slice_0(meshes)
  hbm = tpu.hbm_bytes * tpu.chips * num_slices // len(devices)
  print(f'{runtime.describe()}; meshes: {meshes.describe()}', flush=True)

  plan = job.compile_plan(config, meshes)
  roofline = estimate.Roofline.of(tpu) if with_estimate else None
  measured = []
  for phase in plan.all_phases(runtime):
    print(f'compiling {phase.name} on {phase.role} ...', flush=True)
    measured.append(_measure(phase, roofline,
                             meshes.by_role[phase.role].devices.size))

  rows = _device_groups(meshes, plan, measured, hbm)
  worst = max(rows, key=lambda row: row['peak'])
  seconds = sum(m.seconds for m in measured)
  fits = worst['peak'] <= hbm
  out = dict(job=config.job, model=config.model.preset,
             backend=backend_name, tpu_type=tpu.name, num_slices=num_slices,
             chips=tpu.chips * num_slices, devices=len(devices),
             hbm_per_device=hbm, peak_per_device=worst['peak'],
             fits=fits, compile_seconds=seconds,
             programs={m.phase.name: dict(count=m.programs,
                                          seconds=m.seconds, temp=m.temp)
                       for m in measured},
             groups=rows)
  if roofline:
    timed = [r for m in measured for r in m.rows]
    total = estimate.step(timed, roofline, len(devices), plan.tokens_per_step)
    print(estimate.report(timed, total), flush=True)
    out['estimate'] = dict(step=total, phases=[r.to_json() for r in timed])
  print(f'compiled {sum(m.programs for m in measured)} programs in '
        f'{seconds:.1f} s; peak {size(worst["peak"])} per device of '
        f'{size(hbm)}: {"fits" if fits else "DOES NOT FIT"}', flush=True)
  return out


def check(config: Any, job: Any, tpu_type: str, num_slices: int,
          workdir: str | None, backend_name: str = backend.PATHWAYS,
          with_estimate: bool = False) -> None:
  """`report`, written as JSON into `workdir` (when given). Raises
  UsageError with the numbers when a device would need more than its
  HBM."""
  out = report(config, job, tpu_type, num_slices, backend_name,
               with_estimate)
  if workdir:
    workdir_lib.write_json(workdir, workdir_lib.COMPILE_REPORT, out)
  if not out['fits']:
    worst = max(out['groups'], key=lambda row: row['peak'])
    raise UsageError(
        f'the {config.job} job does not fit {num_slices} x '
        f'{out["tpu_type"]}: devices {_span(worst["devices"])} '
        f'({", ".join(worst["roles"])}) need {size(worst["peak"])} of '
        f'{size(out["hbm_per_device"])} HBM, the largest phase being '
        f'{worst["largest_phase"]}; use more chips, smaller micro batches, '
        'remat or bfloat16.')
