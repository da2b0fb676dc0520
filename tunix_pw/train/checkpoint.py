"""Orbax checkpoints of a job's whole state, in <workdir>/checkpoints.

Each checkpoint holds the train state (trainable parameters, optimizer
state, step, RNG) and the data position: every process's data state merged
into one (each process reads its own data shards), which any number of
processes restores, with the devices and processes that wrote it. Any mesh
restores it (Orbax reads each array into the job's shardings). Saves are
asynchronous (the device-to-host copy happens before `save` returns, the
writing in the background) and the last `keep` are kept. Orbax finalises a
checkpoint atomically, so a crash mid-save leaves no complete-looking step;
a newest step that is nonetheless unreadable (a torn copy) is skipped with
a warning and the one before used, and is overwritten when the run saves
that step again. When no step restores into the job's state, the run is
refused (exit 2) rather than started over: the checkpoints are kept. All
processes restore the same step.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from etils import epath
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from tunix_pw import workdir as workdir_lib
from tunix_pw.errors import UsageError

TOPOLOGY = '_topology'  # in the data item: who wrote the checkpoint


def _devices(state: Any) -> set[jax.Device]:
  return {d for x in jax.tree.leaves(state) if hasattr(x, 'sharding')
          for d in x.sharding.device_set}


def topology(state: Any) -> dict[str, int]:
  """The devices and processes that hold `state` (after an elastic slice
  loss, fewer than the runtime's)."""
  devices = _devices(state)
  return dict(devices=len(devices),
              processes=len({d.process_index for d in devices}))


def holders(state: Any) -> set[int]:
  """The processes whose devices hold a share of `state` (in a
  disaggregated multi-controller layout, the actor's hosts only)."""
  return {d.process_index for d in _devices(state)}


def _abstract(tree: Any) -> Any:
  """Shapes, dtypes and shardings of a tree of arrays (the restore target)."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      tree)


class Checkpointer:
  """Only the `holders` of the state (default: every process) write it, as
  an Orbax manager over that subset of processes; the others, which hold no
  share, take part in the data-position merge and read that position back
  on resume. Process 0 must be a holder: Orbax writes parts of every
  checkpoint from it (the metadata, and arrays in host memory). A state
  wholly on one process of several is written from host memory: Orbax takes
  a fully addressable array in a multi-process job for a host-local one and
  refuses it."""

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True,
               holders: set[int] | None = None):
    self.directory = workdir_lib.path(workdir, workdir_lib.CHECKPOINTS)
    everyone, me = set(range(jax.process_count())), jax.process_index()
    if holders is not None and 0 not in holders:
      raise UsageError(
          f'the trained state lives on the devices of processes '
          f'{sorted(holders)} only, and Orbax writes parts of every '
          'checkpoint from process 0; give the actor devices of process 0 '
          "(its devices come first, e.g. --config.meshes.actor.devices=0:N).")
    self.writes = holders is None or me in holders
    # A process without a share gets a manager of its own, which only reads.
    group = everyone if holders is None else holders if self.writes else {me}
    if group != everyone:  # Orbax leaves the folder to the caller then
      epath.Path(self.directory).mkdir(parents=True, exist_ok=True)
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save,
            cleanup_tmp_directories=self.writes, create=group == everyone,
            multiprocessing_options=ocp.options.MultiprocessingOptions(
                primary_host=min(group),
                active_processes=None if group == everyone else group)),
        item_names=('state', 'data'))
    self._saved: set[int] = set()

  def save(self, step: int, state: Any, data_state: dict[str, Any]) -> None:
    """Saves `step` with the merge of every process's `data_state`. A step this run
    saved already is not saved twice; one left by an earlier run (a torn
    copy the resume skipped) is replaced."""
    if step in self._saved:
      return
    self._saved.add(step)
    data = dict(_merged(data_state), **{TOPOLOGY: topology(state)})
    if not self.writes:
      return
    if step in self.manager.all_steps():
      self.manager.wait_until_finished()
      self.manager.delete(step)
    if jax.process_count() > 1 and all(
        x.is_fully_addressable for x in jax.tree.leaves(state)):
      state = jax.device_get(state)
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data)),
                      force=True)

  def restore(self, like: Any) -> tuple[Any, dict[str, Any], int,
                                         dict[str, int]] | None:
    """The newest checkpoint that restores into the shardings of `like` (a
    state of arrays) on every process, with the merged
    data state, its step and the topology that wrote it ({} if unrecorded);
    None when there is none. Raises UsageError when
    checkpoints exist but none restores."""
    items = dict(data=ocp.args.JsonRestore())
    if self.writes:
      items['state'] = ocp.args.StandardRestore(_abstract(like))
    problems = []
    steps = [int(s) for s in multihost_utils.broadcast_one_to_all(
        np.array(sorted(self.manager.all_steps(), reverse=True) or [-1]))]
    for step in (s for s in steps if s >= 0):
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(
            **items))
      except Exception as e:  # pylint: disable=broad-exception-caught
        restored = None
        problems.append(f'step {step}: {type(e).__name__}: '
                        f'{str(e).splitlines()[0][:200] if str(e) else ""}')
      if _everywhere(restored is not None):
        if problems:
          logging.warning('%s: resuming from step %d; newer checkpoints are '
                          'unreadable (%s)', self.directory, step,
                          '; '.join(problems))
        data = dict(restored.data)
        # A process without a share keeps `like`'s arrays: they hold none.
        state = restored.state if self.writes else like
        return state, data, step, data.pop(TOPOLOGY, {})
    if problems:
      raise UsageError(
          f'{self.directory} holds checkpoints, but none restores into this '
          f'job\'s state ({problems[0]}); resume with the config that wrote '
          'them, or use a new --workdir.')
    return None

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def latest_params(workdir: str, like: Any) -> Any:
  """Just the trainable parameters of a workdir's latest checkpoint (for
  inference), into the shardings of `like`."""
  directory = workdir_lib.path(workdir, workdir_lib.CHECKPOINTS)
  manager = ocp.CheckpointManager(directory, item_names=('state', 'data'))
  target = {'params': _abstract(like)}
  problems = []
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      restored = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
              item=target, partial_restore=True,
              restore_args=ocp.checkpoint_utils.construct_restore_args(
                  target))))
    except Exception as e:  # pylint: disable=broad-exception-caught
      problems.append(f'step {step}: {type(e).__name__}: {str(e)[:120]}')
      continue
    if problems:
      logging.warning('%s: using step %d; newer ones are unreadable (%s)',
                      directory, step, '; '.join(problems))
    return restored.state['params']
  raise UsageError(
      f'{workdir} is a tunix_pw workdir but {directory} holds no readable '
      'checkpoint' + (f' ({"; ".join(problems)})' if problems else '') + '.')


def complete_steps(workdir: str) -> list[int]:
  """The steps of a workdir's finalised checkpoints, oldest first (Orbax
  writes a step locally under a temporary name and renames it when
  complete; on GCS it marks it complete last)."""
  return sorted(ocp.step.checkpoint_steps(
      workdir_lib.path(workdir, workdir_lib.CHECKPOINTS)))


def _everywhere(ok: bool) -> bool:
  """Whether `ok` holds on every process."""
  if jax.process_count() == 1:
    return ok
  return bool(np.min(multihost_utils.process_allgather(np.int32(ok))))


def _merged(data_state: dict[str, Any]) -> dict[str, Any]:
  """Every process's data state as one: the union of their dicts (a
  pipeline's shards by index), process 0's value where they share a key."""
  if jax.process_count() == 1:
    return data_state
  blob = np.frombuffer(json.dumps(data_state).encode(), np.uint8)
  sizes = multihost_utils.process_allgather(np.int32(len(blob)))
  padded = np.zeros(int(np.max(sizes)), np.uint8)
  padded[:len(blob)] = blob
  blobs = multihost_utils.process_allgather(padded)
  return functools.reduce(_union, [json.loads(bytes(b[:n]).decode())
                                   for b, n in zip(blobs, sizes)])


def _union(a: Any, b: Any) -> Any:
  if not isinstance(a, dict) or not isinstance(b, dict):
    return a
  return {**b, **{k: _union(v, b[k]) if k in b else v for k, v in a.items()}}
