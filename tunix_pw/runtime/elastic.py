"""Elastic slices on Pathways: a job that outlives the loss of a slice.

With `--config.runtime.elastic.min_slices=N` (N >= 1) a Pathways job runs as
attempts under pathwaysutils' elastic manager. An attempt builds the meshes
on the devices of the slices that are healthy now and runs the job, which
resumes from the workdir's newest checkpoint (onto the new topology: Orbax
reads each array into the new shardings, the global batch and the data
position carry over). A slice lost mid-step fails that step with a JAX
runtime error the manager recognises (DATA_LOSS, ...); it waits until at
least N slices answer its health check, polling every `poll_s`, and starts
the next attempt in the same process: no pod restart. When the slices do
not come back within `timeout_s`, or `max_attempts` attempts each lost one,
the job exits 42 so that XPK restarts it on new slices. Any other error ends
the job as usual.

Meshes whose axes name sizes (fsdp=256) need every device back: give the
axis that should shrink as -1 (fsdp=-1) to run on fewer slices.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import logging
from typing import Any

from tunix_pw import checks
from tunix_pw.errors import UsageError
from tunix_pw.runtime import backend
from tunix_pw.runtime.preemption import Preempted


def check(block: Any, prefix: str = '--config.runtime.elastic') -> None:
  """Static checks of the elastic block."""
  if isinstance(block.min_slices, bool) or not isinstance(
      block.min_slices, int) or block.min_slices < 0:
    raise UsageError(f'{prefix}.min_slices={block.min_slices!r} must be an '
                     'integer of at least 0 (0: not elastic).')
  checks.at_least_one(block, prefix, 'max_attempts')
  for field, least in (('poll_s', 1e-3), ('timeout_s', 0)):
    value = block[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        least <= value < float('inf')):
      raise UsageError(f'{prefix}.{field}={value!r} must be a number of '
                       f'seconds from {least} on.')


def run(block: Any, runtime: backend.Runtime,
        attempt: Callable[[backend.Runtime], None]) -> None:
  """`attempt(runtime)` once, or (elastic on Pathways) until one ends
  without a slice loss, each on the devices of the healthy slices."""
  if not block.min_slices or runtime.backend != backend.PATHWAYS:
    attempt(runtime)
    return
  from pathwaysutils.elastic import manager as manager_lib  # pylint: disable=g-import-not-at-top
  manager = manager_lib.Manager(runtime.devices)
  if block.min_slices > manager.total_slice_count:
    raise UsageError(
        f'--config.runtime.elastic.min_slices={block.min_slices} exceeds the '
        f"job's {manager.total_slice_count} slices.")
  attempts = [0]

  def on_slice_loss() -> None:
    logging.warning('elastic: a slice was lost during attempt %d; waiting '
                    'for %d healthy slice(s) of %d', attempts[0],
                    block.min_slices, manager.total_slice_count)

  @manager.elastic_retry(
      minimum_slice_count=block.min_slices, poll_interval=block.poll_s,
      timeout=block.timeout_s or None, on_elastic_event_callback=on_slice_loss,
      retry_policy=manager_lib.ElasticRetryLimit(block.max_attempts))
  def on_healthy_slices() -> None:
    attempts[0] += 1
    slices = sorted(manager.active_slice_indices)
    healthy = {d for i in slices for d in manager.slice_to_devices[i]}
    devices = tuple(d for d in runtime.devices if d in healthy)
    if runtime.is_coordinator and attempts[0] > 1:
      print(f'elastic: attempt {attempts[0]} on slices {slices} '
            f'({len(devices)} of {len(runtime.devices)} devices)', flush=True)
    attempt(dataclasses.replace(runtime, devices=devices))

  try:
    on_healthy_slices()
  except (manager_lib.ElasticRuntimeError, TimeoutError) as e:
    # A new JobSet gets new slices: exit 42 (XPK restarts), the checkpoints
    # kept.
    raise Preempted(f'elastic: {e}; the last checkpoint is kept') from e
