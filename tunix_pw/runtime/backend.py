"""Detects and starts the job's runtime: Pathways, multi-controller or local.

Everything after `start` reads the returned `Runtime` instead of the
environment, so the same job code runs on one Pathways controller, on one
process per host, or in a single local process.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import os
from typing import Any

import jax

from tunix_pw.errors import UsageError

PATHWAYS = 'pathways'
MULTI_CONTROLLER = 'multi_controller'
LOCAL = 'local'

# Default coordinator ports, by the cluster flavour that names the address.
_CPU_PORT = 1234  # JobSets for CPU pods name the host only.
_TPU_PORT = 8476  # the port JAX's own TPU cluster detection uses.


@dataclasses.dataclass(frozen=True)
class Detection:
  """What the environment asks for, before anything is started."""

  backend: str
  reason: str
  coordinator_address: str | None = None
  process_count: int = 1
  process_id: int = 0


@dataclasses.dataclass(frozen=True)
class Runtime:
  """The started runtime: the one value the rest of the code reads."""

  backend: str
  reason: str
  process_index: int
  process_count: int
  devices: tuple[Any, ...]  # global devices in jax.devices() order

  @property
  def is_coordinator(self) -> bool:
    """True on the one process that writes shared files and prints."""
    return self.process_index == 0

  def describe(self) -> str:
    return (f'runtime {self.backend} ({self.reason}): process '
            f'{self.process_index} of {self.process_count}, '
            f'{len(self.devices)} {self.devices[0].platform} devices')


def _int_var(env: Mapping[str, str], name: str) -> int:
  value = env.get(name)
  if value is None:
    raise UsageError(f'environment variable {name} is missing; the cluster '
                     'environment names a coordinator but not this value.')
  try:
    return int(value)
  except ValueError:
    raise UsageError(
        f'environment variable {name}={value!r} is not an integer.') from None


def _with_port(address: str, port: int | str) -> str:
  return address if ':' in address else f'{address}:{port}'


def detect(env: Mapping[str, str],
           coordinator_address: str = '',
           process_count: int = 0,
           process_id: int = -1) -> Detection:
  """Chooses the backend from the environment and explicit flags.

  Pure: reads only its arguments, so every cluster flavour is table-tested.
  """
  if 'proxy' in env.get('JAX_PLATFORMS', ''):
    return Detection(PATHWAYS, 'JAX_PLATFORMS names the Pathways proxy')

  if coordinator_address:
    if process_count < 1 or not 0 <= process_id < process_count:
      raise UsageError(
          '--coordinator_address needs --num_processes >= 1 and '
          '0 <= --process_id < --num_processes.')
    return Detection(MULTI_CONTROLLER, 'explicit --coordinator_address flag',
                     coordinator_address, process_count, process_id)

  hosts = [h for h in env.get('TPU_WORKER_HOSTNAMES', '').split(',') if h]
  num_slices = int(env.get('MEGASCALE_NUM_SLICES', '1') or 1)
  if len(hosts) > 1 or num_slices > 1:
    hosts = hosts or ['localhost']
    slice_id = _int_var(env, 'MEGASCALE_SLICE_ID') if num_slices > 1 else 0
    worker_id = _int_var(env, 'TPU_WORKER_ID') if len(hosts) > 1 else 0
    coordinator = (env.get('MEGASCALE_COORDINATOR_ADDRESS') if num_slices > 1
                   else hosts[0]) or hosts[0]
    return Detection(
        MULTI_CONTROLLER,
        f'TPU pod: {len(hosts)} hosts x {num_slices} slices',
        _with_port(coordinator, _TPU_PORT), len(hosts) * num_slices,
        slice_id * len(hosts) + worker_id)

  address = env.get('JAX_COORDINATOR_ADDRESS')
  if address and 'NNODES' in env:
    port = env.get('JAX_COORDINATOR_PORT', str(_CPU_PORT))
    return Detection(MULTI_CONTROLLER, 'GPU JobSet (NNODES, NODE_RANK)',
                     _with_port(address, port), _int_var(env, 'NNODES'),
                     _int_var(env, 'NODE_RANK'))
  if address:
    per_job = _int_var(env, 'PROCESSES_IN_JOB')
    pid = (_int_var(env, 'JOB_INDEX') * per_job +
           _int_var(env, 'JOB_COMPLETION_INDEX'))
    count = _int_var(env, 'JAX_PROCESS_COUNT')
    if not 0 <= pid < count:
      raise UsageError(f'the process id {pid} from JOB_INDEX, PROCESSES_IN_JOB '
                       f'and JOB_COMPLETION_INDEX is outside '
                       f'JAX_PROCESS_COUNT={count}.')
    return Detection(MULTI_CONTROLLER, 'CPU JobSet (JAX_COORDINATOR_ADDRESS)',
                     _with_port(address, _CPU_PORT), count, pid)

  return Detection(LOCAL, 'no Pathways proxy and no coordinator in the '
                   'environment')


def cache_compiled_programs(directory: str) -> None:
  """Keeps every program this process compiles under `directory`, not only
  those over JAX's 1 s default: a restarted job (preemption, a new
  topology) or the next run of the same config then compiles nothing it
  compiled before (the GRPO pulse: 20.6 s cold, 12.0 s warm at the default,
  9.0 s with every program cached)."""
  jax.config.update('jax_compilation_cache_dir', directory)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)


def accelerator_present() -> bool:
  """Whether this host has an accelerator: a TPU chip on the PCI bus (JAX's
  own scan, the one that decides whether libtpu sets up a TPU VM) or a
  visible NVIDIA or AMD GPU. Without one, and without an explicit
  JAX_PLATFORMS (Pathways sets `proxy`), a job runs on CPU."""
  try:
    from jax._src import hardware_utils  # pylint: disable=g-import-not-at-top
  except ImportError:  # JAX moved it: leave the choice to JAX
    return True
  return (hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0 or
          hardware_utils.has_visible_nvidia_gpu() or
          hardware_utils.num_available_amd_gpus(stop_at=1) > 0)


def _bind_address(coordinator: str) -> str | None:
  """A coordinator named by a loopback address listens on loopback only
  (launch/local.py's processes on one machine); others on every interface,
  JAX's default, since their peers are other hosts."""
  host, _, port = coordinator.rpartition(':')
  if host in ('localhost', '::1', '[::1]') or host.startswith('127.'):
    return f'{"[::1]" if "::1" in host else "127.0.0.1"}:{port}'
  return None


# Virtual CPU devices per process at most: XLA hangs or aborts with tens of
# thousands (found by tests/test_fuzz.py).
MAX_HOST_DEVICES = 512


# XLA:CPU's concurrency-optimised scheduler lets the devices of one sharded
# program run independent collectives in different orders: a Gemma 3 vision
# model's train step on fsdp=4 x tp=2 deadlocked, some devices waiting in a
# collective permute and others in an all-reduce. Scheduled in program
# order, every device meets its collectives in the same order.
CPU_XLA_FLAGS = ('--xla_cpu_enable_concurrency_optimized_scheduler=false',)


def _cpu_flags() -> None:
  """CPU_XLA_FLAGS into XLA_FLAGS (read when the backend starts), unless
  the environment sets them."""
  flags = os.environ.get('XLA_FLAGS', '')
  extra = [f for f in CPU_XLA_FLAGS if f.split('=')[0] not in flags]
  os.environ['XLA_FLAGS'] = ' '.join([flags] + extra).strip()


def start(detection: Detection, host_device_count: int = 0,
          peer_timeout_s: int = 300) -> Runtime:
  """Starts the detected backend and returns the Runtime.

  Args:
    detection: what `detect` chose.
    host_device_count: virtual CPU devices for the whole job, split evenly over
      its processes; only applies when JAX runs on CPU (tests, demos).
  """
  if host_device_count:
    per_process = host_device_count // detection.process_count
    if host_device_count < 0 or per_process > MAX_HOST_DEVICES:
      raise UsageError(
          f'--config.runtime.host_device_count={host_device_count} must be '
          f'between 0 and {MAX_HOST_DEVICES} virtual CPU devices per process '
          '(0: JAX\'s default).')
    if host_device_count % detection.process_count:
      raise UsageError(
          f'--config.runtime.host_device_count={host_device_count} does not '
          f'divide over {detection.process_count} processes; use a multiple.')
    jax.config.update('jax_num_cpu_devices',
                      host_device_count // detection.process_count)

  if not jax.config.jax_platforms and not accelerator_present():
    # libtpu (the tpu and test extras) makes JAX try a TPU backend even on a
    # host without one, and libtpu logs errors (TPU_WORKER_HOSTNAMES, host
    # bounds) before JAX falls back to CPU.
    jax.config.update('jax_platforms', 'cpu')
  if jax.config.jax_platforms == 'cpu':
    _cpu_flags()
  if detection.backend == PATHWAYS:
    import pathwaysutils  # pylint: disable=g-import-not-at-top
    pathwaysutils.initialize()
  elif detection.backend == MULTI_CONTROLLER:
    # Cross-process collectives on CPU (tests, CPU pods); ignored elsewhere.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    # A peer that does not connect, or stops sending heartbeats (stuck,
    # stopped, gone), ends every process with an error after the timeout
    # instead of leaving them blocked in a collective forever.
    jax.distributed.initialize(
        detection.coordinator_address, detection.process_count,
        detection.process_id,
        coordinator_bind_address=_bind_address(
            detection.coordinator_address),
        initialization_timeout=peer_timeout_s,
        heartbeat_timeout_seconds=peer_timeout_s)

  return Runtime(detection.backend, detection.reason, jax.process_index(),
                 jax.process_count(), tuple(jax.devices()))

