"""The programs a job compiles, as its compile plan holds them and as a run
of it compiles them:

  python -m tests.compiled_programs OUT.json --config=... --workdir=...

runs the job (its main flags) in this process, and first lowers every
program of the job's `compile_plan` on the same role meshes; writes
{"plan": [...], "run": [...]} to OUT.json, each a program as [name, where
its function is defined, [argument shape and dtype, ...], [argument
sharding, ...], bounded, operations] (shardings normalised: equal
placements read the same; `bounded`: a plan's program from a
`Phase.bounded` phase, whose shapes are the largest the run compiles it
at; operations: the primitives it applies).

A program is a jit of the package's own functions, or a copy of arrays
from one layout to another (the weight sync's and the log-probabilities'
relayouts, `jnp.copy` with a sharding). Single jax.numpy/lax operations
dispatched one at a time outside jit (a metric's mean, an index into the
sampler's output) are not programs a plan describes; they are left out.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from jax._src.interpreters import pxla

SOURCES = {'plan': [], 'run': []}
_now = SOURCES['run']
_bounded = False  # whether the phase being lowered is `Phase.bounded`


def _placement(sharding: Any, aval: Any) -> str:
  """A sharding as its devices and how it tiles them, whatever the shape:
  equal placements (P('x') and P('x', None); a fully replicated
  NamedSharding, an uncommitted argument) read the same."""
  if not hasattr(sharding, '_to_xla_hlo_sharding') or (
      sharding.is_fully_replicated):
    return 'replicated'  # uncommitted (host) arguments: replicated
  return repr(([d.id for d in sharding._device_assignment],  # pylint: disable=protected-access
               str(sharding._to_xla_hlo_sharding(len(aval.shape)))))  # pylint: disable=protected-access


def _operations(jaxpr: Any) -> str:
  """The primitives a program applies, nested ones included (what it does
  whatever its shapes: a greedy and a sampled decode loop differ)."""
  names, todo = set(), [jaxpr]
  while todo:
    for eqn in todo.pop().eqns:
      names.add(eqn.primitive.name)
      for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else [param]:
          if hasattr(sub, 'eqns') or hasattr(sub, 'jaxpr'):
            todo.append(getattr(sub, 'jaxpr', sub))
  return ','.join(sorted(names))


def _is_program(name: str, where: str) -> bool:
  return f'{os.sep}tunix_pw{os.sep}' in where or name == 'copy'


_lower = pxla.lower_sharding_computation


def _recording(closed_jaxpr, api_name, fun_name, in_shardings, *args,
               **kwargs):
  where = closed_jaxpr.jaxpr.debug_info.func_src_info
  if _is_program(fun_name, where):
    avals = closed_jaxpr.in_avals
    _now.append([fun_name, where.split(' at ')[-1].rsplit(':', 1)[0],
                 [str(a) for a in avals],
                 [_placement(s, a) for s, a in zip(in_shardings, avals)],
                 _bounded, _operations(closed_jaxpr.jaxpr)])
  return _lower(closed_jaxpr, api_name, fun_name, in_shardings, *args,
                **kwargs)


pxla.lower_sharding_computation = _recording


def _planned_first(name: str, job: Any) -> None:
  """`job.run` of a `name` job's config lowers every program of the job's
  compile plan on its role meshes (recorded as the plan's), then runs
  (recorded as the run's); another job calling it just runs."""
  run = job.run

  def plan_then_run(config, runtime, meshes, *args, **kwargs):
    global _now, _bounded
    if config.job != name:
      return run(config, runtime, meshes, *args, **kwargs)
    _now = SOURCES['plan']
    for phase in job.compile_plan(config, meshes).all_phases(runtime):
      _bounded = phase.bounded
      phase.compile()
    _now, _bounded = SOURCES['run'], False
    return run(config, runtime, meshes, *args, **kwargs)

  job.run = plan_then_run


def main() -> None:
  out = sys.argv.pop(1)
  from tunix_pw import jobs, main as main_lib, registry  # pylint: disable=g-import-not-at-top
  for name in registry.names('job'):
    job = jobs.get(name)
    if hasattr(job, 'compile_plan'):
      _planned_first(name, job)
  try:
    main_lib.run()
  finally:
    with open(out, 'w') as f:
      json.dump(SOURCES, f)


if __name__ == '__main__':
  main()
