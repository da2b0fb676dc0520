r"""Entry point of every tunix_pw job.

  python -m tunix_pw.main --config=tunix_pw/configs/smoke.py[:arg] \
      [--config.a.b=value ...] --workdir=DIR
  python -m tunix_pw.main --config=... --compile_topology=v5p-512 \
      [--compile_num_slices=N]   # does the job fit? (no TPU needed)
  python -m tunix_pw.main --config=... --compile_topology=v5p-2048 \
      --plan_layout   # the fastest layouts that fit, ranked
  python -m tunix_pw.main --config=... --print_config  # fields, with help
  python -m tunix_pw.main list   # the jobs' config files and arguments
  python -m tunix_pw.main reference > docs/reference.md

Exit codes: 0 done; 2 bad config, usage or input (one sentence on stderr,
no traceback); 42 preempted after a checkpoint (XPK restarts on it); 1 an
infrastructure failure (one sentence: e.g. code sandboxes that cannot
start), the workdir's disk is full (one sentence; the complete checkpoints
are intact) or a crash.
"""

from __future__ import annotations

from tunix_pw.runtime import allocator

if __name__ == '__main__':  # before JAX loads (runtime/allocator.py)
  allocator.use_tcmalloc()

import difflib
import errno
import importlib.util
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from absl import app, flags, logging
from etils import epath
import jax
import ml_collections
from ml_collections import config_flags

from tunix_pw import checks, compile_only, console, jobs, planner
from tunix_pw.configs import reference
from tunix_pw.data import pipeline
from tunix_pw.models import blocks, decoder
from tunix_pw import workdir as workdir_lib
from tunix_pw.errors import InfrastructureError, UsageError, disk_full
from tunix_pw.runtime import backend, elastic, meshes
from tunix_pw.runtime.preemption import EXIT_PREEMPTED, Preempted, Preemption
from tunix_pw.runtime.preemption import watch_sigterm
from tunix_pw.train import checkpoint, goodput, metrics

CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file and optional arg: path.py[:arg].',
    lock_config=True)
WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Job directory: config snapshot, checkpoints, metrics. '
    'A run into an existing workdir resumes it.')
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', '', 'Multi-controller coordinator host:port; '
    'overrides what the cluster environment says.')
_NUM_PROCESSES = flags.DEFINE_integer(
    'num_processes', 0, 'Process count, with --coordinator_address.')
_PROCESS_ID = flags.DEFINE_integer(
    'process_id', -1, 'This process id, with --coordinator_address.')
_COMPILE_TOPOLOGY = flags.DEFINE_string(
    'compile_topology', '', 'Compile only, against this TPU type (XPK names: '
    'v5p-512, v5litepod-16, v6e-256, v4-128): report HBM per device, exit 2 '
    'when the job does not fit. Needs libtpu, not a TPU.')
_COMPILE_NUM_SLICES = flags.DEFINE_integer(
    'compile_num_slices', 1, 'Slices of --compile_topology.')
_COMPILE_BACKEND = flags.DEFINE_enum(
    'compile_backend', backend.PATHWAYS,
    [backend.PATHWAYS, backend.MULTI_CONTROLLER],
    'The backend --compile_topology compiles for: one Pathways controller, '
    "or one process per host (XPK's mcjax), whose weight sync between "
    'processes runs other programs.')
_ESTIMATE = flags.DEFINE_bool(
    'estimate', False, 'With --compile_topology: also estimate the step\'s '
    'time, phase by phase, from the compiled programs and the chip\'s '
    'published figures (tokens/s, MFU, what bounds each phase).')
_PLAN_LAYOUT = flags.DEFINE_bool(
    'plan_layout', False, 'With --compile_topology, for an RL job: size '
    'every layout (rollout share of the chips or collocated, rollout tp, '
    'FSDP width, micro batch, remat) from shapes, compile the '
    '--plan_compile fastest that may fit, and print those that fit, ranked '
    'by estimated step time, with the overrides that select each.')
_PLAN_COMPILE = flags.DEFINE_integer(
    'plan_compile', 5, 'Layouts --plan_layout compiles (minutes each for a '
    'large model).')
_PRINT_CONFIG = flags.DEFINE_bool(
    'print_config', False, 'Print the resolved config, overrides included, '
    'each field with its help, and exit.')
_CHECK_ONLY = flags.DEFINE_bool(
    'check_only', False, 'Run both validation phases (the config, then the '
    'devices) and exit 0 or 2; nothing is written, no job runs. With '
    '--compile_topology: the config phase only (shapes, no files or data), '
    'nothing compiled.')

_FLAGS = (CONFIG, WORKDIR, _PRINT_CONFIG, _CHECK_ONLY, _COMPILE_TOPOLOGY,
          _COMPILE_NUM_SLICES, _COMPILE_BACKEND, _ESTIMATE, _PLAN_LAYOUT,
          _PLAN_COMPILE, _COORDINATOR,
          _NUM_PROCESSES, _PROCESS_ID)


def _command_line() -> list[tuple[str, Any, str]]:
  return [(f.name, f.default, flags.FLAGS[f.name].help) for f in _FLAGS]


def _exit_codes() -> str:
  """The module docstring's paragraph on exit codes."""
  return next(p.strip() for p in __doc__.split('\n\n')
              if p.startswith('Exit codes'))


EXIT_USAGE = 2
EXIT_DISK_FULL = EXIT_INFRASTRUCTURE = 1


def _fail(message: str, code: int = EXIT_USAGE) -> None:
  print(f'error: {message}', file=sys.stderr, flush=True)
  sys.exit(code)


def _config_arg(argv: Sequence[str]) -> str:
  for i, arg in enumerate(argv):
    if arg.startswith('--config='):
      return arg.split('=', 1)[1]
    if arg == '--config' and i + 1 < len(argv):
      return argv[i + 1]
  raise UsageError('--config is required, e.g. '
                   '--config=tunix_pw/configs/demo.py.')


def _load_config_file(spec: str) -> ml_collections.ConfigDict:
  """Loads `path.py[:arg]` the way config_flags does, with clear errors."""
  path, _, arg = spec.partition(':')
  if not os.path.isfile(path) or not os.access(path, os.R_OK):
    raise UsageError(f'--config={spec}: no readable config file at {path!r}.')
  try:
    module_spec = importlib.util.spec_from_file_location('_tunix_cfg', path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()
  except Exception as e:  # any failure of user code in the config file
    raise UsageError(f'--config={spec}: get_config failed: '
                     f'{type(e).__name__}: {e}') from None


def _check_override_keys(config: ml_collections.ConfigDict,
                         argv: Sequence[str]) -> None:
  """Names a misspelled --config.a.b override, with the closest field."""
  for arg in argv:
    name = arg.split('=', 1)[0].lstrip('-')
    if name.startswith('noconfig.'):
      name = name[2:]
    if not name.startswith('config.'):
      continue
    node = config
    for key in name.split('.')[1:]:
      fields = list(node.keys()) if hasattr(node, 'keys') else []
      if key not in fields:
        close = difflib.get_close_matches(key, fields, n=1)
        hint = f'did you mean {close[0]!r}?' if close else (
            f'fields here: {", ".join(fields) or "none"}.')
        raise UsageError(f'--{name}: the config has no field {key!r}; {hint}')
      node = node[key]


def _describe_flag_error(config: ml_collections.ConfigDict, error: str) -> str:
  """'flag --config.steps=abc: invalid literal...' -> a sentence with the
  type the field expects."""
  match = re.match(r'flag --config\.([\w.]+)=(.*?): ', error)
  if not match:
    return error.rstrip('.') + '.'
  key, value = match.groups()
  current = config
  for part in key.split('.'):
    current = current[part]
  return (f'--config.{key}={value!r} is not a valid '
          f'{type(current).__name__}, the type of that field.')


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with every config problem turned into exit 2."""
  if argv[1:] == ['list']:
    print(reference.jobs_table())
    sys.exit(0)
  if argv[1:] == ['reference']:
    print(reference.reference(_command_line(), _exit_codes()), end='')
    sys.exit(0)
  try:
    config = _load_config_file(_config_arg(argv[1:]))
    _check_override_keys(config, argv[1:])
    try:
      rest = flags.FLAGS(argv)
    except flags.Error as e:
      raise UsageError(_describe_flag_error(config, str(e))) from None
    except (ValueError, TypeError, AttributeError, KeyError) as e:
      raise UsageError(f'bad --config override: {e}') from None
    if not isinstance(CONFIG.value, ml_collections.ConfigDict):
      raise UsageError(f'--config={_config_arg(argv[1:])} did not load.')
    return rest
  except UsageError as e:
    _fail(str(e))


def _flat(tree: Any, prefix: str = '') -> dict[str, Any]:
  if not isinstance(tree, dict):
    return {prefix: tree}
  out = {}
  for k, v in tree.items():
    out.update(_flat(v, f'{prefix}.{k}' if prefix else k))
  return out


def _shape_defining(config: dict[str, Any]) -> dict[str, Any]:
  """The fields a checkpoint depends on, in a job or a pipeline's stages:
  the job and stages, the model, LoRA and the optimizer's kind (its state's
  structure). Meshes are not among them: a checkpoint restores into any."""

  def defining(key: str) -> bool:
    parts = key.split('.')
    return (parts[-1] in ('job', 'stages') and len(parts) <= 2 or
            'model' in parts or 'lora' in parts or
            parts[-2:] == ['optimizer', 'name'])

  return {k: v for k, v in _flat(config).items() if defining(k)}


def _placement(config: dict[str, Any]) -> dict[str, Any]:
  """The fields that place a job on devices: meshes and virtual devices."""
  return {k: v for k, v in _flat(config).items()
          if 'meshes' in k.split('.') or k.endswith('host_device_count')}


def check_resume(config: ml_collections.ConfigDict,
                 workdir: epath.Path) -> str:
  """Refuses to resume into a workdir whose snapshot differs in shape; the
  placement changes since the snapshot, in words ('' when none)."""
  snapshot = workdir / workdir_lib.CONFIG
  if not snapshot.exists():
    return ''
  try:
    before = json.loads(snapshot.read_text())
  except (OSError, ValueError) as e:
    raise UsageError(f'--workdir={workdir}: unreadable config snapshot '
                     f'{snapshot} ({e}); use a new --workdir.') from None
  now = json.loads(config.to_json_best_effort())
  for key, old, new in _changes(_shape_defining(before), _shape_defining(now)):
    raise UsageError(
        f'--config.{key}={new!r} differs from {old!r} in the snapshot of '
        f'--workdir={workdir}, so its checkpoints cannot resume; use the '
        'same value or a new --workdir.')
  return ', '.join(f'{key} {old!r} -> {new!r}' for key, old, new in
                   _changes(_placement(before), _placement(now)))


def _changes(before: dict[str, Any], now: dict[str, Any]):
  return [(k, before.get(k), now.get(k)) for k in sorted(set(before) | set(now))
          if before.get(k) != now.get(k)]


def _token_lengths(config: ml_collections.ConfigDict) -> dict[str, int]:
  """The lengths of the rows a job trains on, which a sequence axis must
  divide: an RL job's prompt plus new tokens; else the data's rows, padded
  to powers of two from the shortest bucket up to their maximum."""
  if 'rl' in config:
    return {'--config.rl.max_prompt_length + max_new_tokens':
                config.rl.max_prompt_length + config.rl.max_new_tokens}
  if 'max_length' in config.get('data', {}):
    return {'--config.data.max_length': config.data.max_length,
            'the shortest padded length': pipeline.bucket(1)}
  return {}


def _pass_rows(config: ml_collections.ConfigDict) -> dict[str, int]:
  """With stages on the actor's mesh, the rows of its train passes, which
  pipeline micro-batches must divide: an RL job's gradient micro-batch,
  else a train step's micro-batch (each sequence of a pair is a pass of
  its own). Other passes (log-probabilities, a reference's, a critic's)
  run only in some configurations, so they are checked when traced."""
  if _stages(config, ('actor',)) == 1:
    return {}
  if 'rl' in config:
    return {'--config.rl.micro_batch_size': config.rl.micro_batch_size}
  if 'micro_batches' in config:
    return {'--config.batch_size / micro_batches':
                config.batch_size // max(config.micro_batches, 1)}
  return {}


def _stages(config: ml_collections.ConfigDict,
            roles: tuple[str, ...] | None = None) -> int:
  """The widest stage axis of the job's meshes (pipeline stages), or of
  `roles`' meshes."""
  return max([size for role, block in config.meshes.items()
              if role != 'layout' and (roles is None or role in roles)
              for name, size in meshes.parse_axes(
                  block.axes, f'--config.meshes.{role}.axes')
              if name == meshes.STAGE] + [1])


def _check_pipeline(config: ml_collections.ConfigDict,
                    stages: int) -> dict[str, int]:
  """With pipeline stages: the model's repeated layer blocks (which a
  stage axis must divide: a stage runs a run of them), after checking
  that the micro-batches are at least as many as the stages and divide
  the rows of the passes the job trains with."""
  if stages == 1 or 'model' not in config:
    return {}
  micro = config.model.pipeline_microbatches
  if micro < stages:
    raise UsageError(
        f'--config.model.pipeline_microbatches={micro} is fewer than the '
        f'{stages} pipeline stages; use at least {stages} (the bubble is '
        '(stages - 1) / (micro-batches + stages - 1)).')
  for field, rows in _pass_rows(config).items():
    if rows % micro:
      raise UsageError(
          f'--config.model.pipeline_microbatches={micro} does not divide the '
          f'{rows} rows of a pipelined pass ({field}); use a divisor of '
          f'{rows} of at least {stages} (the stages).')
  pattern, count = blocks.architecture(config.model).groups[0]
  return {f"the model's {count} repeated blocks of {len(pattern)} layers":
          count}


def static_checks(config: ml_collections.ConfigDict):
  job, stages = jobs.get(config.job), _stages(config)
  meshes.check(config.meshes, rules=config.get('sharding'),  # the job's
               divides={meshes.SEQUENCE: _token_lengths(config),
                        meshes.STAGE: _check_pipeline(config, stages)})  # (a
  # pipeline's stages have theirs)
  job.validate(config)
  elastic.check(config.runtime.elastic)
  if 'steps' in config and 'profile_steps' in config.get('runtime', {}):
    goodput.profile_window(config.runtime.profile_steps, config.steps)
  if not WORKDIR.value and not _COMPILE_TOPOLOGY.value and not (
      _CHECK_ONLY.value):
    raise UsageError('--workdir is required (checkpoints, metrics and the '
                     'config snapshot go there).')
  if stages > 1 and 'model' in config:
    micro = config.model.pipeline_microbatches
    print(f'pipeline parallelism: the layers in {stages} stages, a pass in '
          f'{micro} micro-batches; each stage idles '
          f'{decoder.bubble(stages, micro):.0%} of a pass (the bubble)',
          flush=True)
  return job


def main(argv: Sequence[str]) -> None:
  watch_sigterm()  # until the job's first check: SIGTERM exits 42 at once
  if len(argv) > 1:
    _fail(f'unexpected arguments {" ".join(argv[1:])!r}; flags take the form '
          '--name=value.')
  for flag in (_ESTIMATE, _PLAN_LAYOUT):
    if flag.value and not _COMPILE_TOPOLOGY.value:
      _fail(f'--{flag.name} needs --compile_topology (a TPU type to compile '
            'for, e.g. v5p-512).')
  config = CONFIG.value
  if _PRINT_CONFIG.value:
    print(reference.print_config(config))
    return
  if not flags.FLAGS['verbosity'].present:
    # Libraries (Orbax above all) log every step at INFO; -v=0 shows them.
    logging.set_verbosity(logging.WARNING)
  try:
    if _COMPILE_TOPOLOGY.value:  # shapes only: no checkpoint, no data
      with checks.limited(files=False, data=False):
        job = static_checks(config)
        if _CHECK_ONLY.value:
          print(f'check_only: the {config.job} config is valid for '
                f'{_COMPILE_TOPOLOGY.value} (not compiled).', flush=True)
          return
        if _PLAN_LAYOUT.value:
          planner.plan(config, job, _COMPILE_TOPOLOGY.value,
                       _COMPILE_NUM_SLICES.value, WORKDIR.value,
                       _COMPILE_BACKEND.value, static_checks,
                       _PLAN_COMPILE.value)
          return
        compile_only.check(config, job, _COMPILE_TOPOLOGY.value,
                           _COMPILE_NUM_SLICES.value, WORKDIR.value,
                           _COMPILE_BACKEND.value, _ESTIMATE.value)
      return
    job = static_checks(config)
    workdir = epath.Path(WORKDIR.value or '.')
    moved = check_resume(config, workdir) if WORKDIR.value else ''
    if config.runtime.compilation_cache_dir and not _CHECK_ONLY.value:
      backend.cache_compiled_programs(config.runtime.compilation_cache_dir)
    detection = backend.detect(os.environ, _COORDINATOR.value,
                               _NUM_PROCESSES.value, _PROCESS_ID.value)
    runtime = backend.start(detection, config.runtime.host_device_count,
                            config.runtime.peer_timeout_s)
    preemption = Preemption(runtime)  # SIGTERM from here on means: stop agreed
    console.plain_every_s = config.runtime.progress_every_s
    if runtime.is_coordinator and not _CHECK_ONLY.value:
      console.announce_compiles()
    role_meshes = meshes.build(config.meshes, runtime.devices)
    if runtime.is_coordinator:
      print(f'{runtime.describe()}; meshes: {role_meshes.describe()}',
            flush=True)
      if moved:
        print(f'resuming {workdir} on a new placement: {moved}', flush=True)
    if _CHECK_ONLY.value:
      if runtime.is_coordinator:
        print(f'check_only: the {config.job} config is valid on these '
              'devices.', flush=True)
      return
    if runtime.is_coordinator:
      workdir.mkdir(parents=True, exist_ok=True)
      (workdir / workdir_lib.CONFIG).write_text(
          config.to_json_best_effort(indent=2))
    elastic.run(config.runtime.elastic, runtime, lambda now: _run_job(
        config, job, now, role_meshes if now.devices == runtime.devices
        else None, str(workdir), preemption))
  except UsageError as e:
    _fail(str(e))
  except InfrastructureError as e:
    _fail(str(e), EXIT_INFRASTRUCTURE)
  except Preempted as e:
    logging.warning('%s; exiting with %d so that the job is restarted', e,
                    EXIT_PREEMPTED)
    sys.exit(EXIT_PREEMPTED)
  except Exception as e:  # pylint: disable=broad-exception-caught
    if not (detail := disk_full(e)):
      raise
    _disk_is_full(WORKDIR.value, detail)


def _run_job(config: ml_collections.ConfigDict, job: Any,
             runtime: backend.Runtime, role_meshes: meshes.RoleMeshes | None,
             workdir: str, preemption: Preemption) -> None:
  """The job on `role_meshes`, or on meshes built anew on `runtime.devices`
  (fewer after an elastic slice loss)."""
  if role_meshes is None:
    role_meshes = meshes.build(config.meshes, runtime.devices)
    if runtime.is_coordinator:
      print(f'meshes: {role_meshes.describe()}', flush=True)
  try:
    job.run(config, runtime, role_meshes, workdir, preemption)
  finally:
    metrics.close_all()


def _disk_is_full(workdir: str, detail: str) -> None:
  """One sentence, then exit at once: a checkpoint write still pending in
  the background would fail again at interpreter exit, with tracebacks."""
  if step := re.search(r'checkpoints/(\d+)\.orbax-checkpoint-tmp', detail):
    detail = f'{os.strerror(errno.ENOSPC)}, writing checkpoint step {step[1]}'
  steps = checkpoint.complete_steps(workdir)
  newest = (f'the newest complete checkpoint there is step {steps[-1]}, '
            'and the same command resumes from it once there is space'
            if steps else 'there is no complete checkpoint there yet')
  print(f'error: the disk under --workdir={workdir} is full ({detail[:200]}); '
        f'{newest}.', file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(EXIT_DISK_FULL)  # pylint: disable=protected-access


def run() -> None:
  """The `tunix-pw` command (the module's imports are loaded by then: under
  TCMalloc, they load again once)."""
  allocator.use_tcmalloc()
  app.run(main, flags_parser=parse_flags)


if __name__ == '__main__':
  run()
