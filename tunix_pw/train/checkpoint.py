"""Orbax checkpoints of a job's whole state, in <workdir>/checkpoints.

Each checkpoint holds the train state (trainable parameters, optimizer
state, step, RNG) and the data iterator's state. Saves are asynchronous
(the device-to-host copy happens before `save` returns, the writing in the
background) and the last `keep` are kept. Orbax finalises a checkpoint
atomically, so a crash mid-save leaves no complete-looking step; a step that
is nonetheless unreadable (a torn copy) is skipped with a warning and the
previous one used.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import orbax.checkpoint as ocp

from tunix_pw import workdir as workdir_lib
from tunix_pw.errors import UsageError



def _abstract(tree: Any) -> Any:
  """Shapes, dtypes and shardings of a tree of arrays (the restore target)."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      tree)


class Checkpointer:

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True):
    self.directory = workdir_lib.path(workdir, workdir_lib.CHECKPOINTS)
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True),
        item_names=('state', 'data'))

  def save(self, step: int, state: Any, data_state: dict[str, Any]) -> None:
    """Saves `step` (a no-op when that step is saved already)."""
    if step in self.manager.all_steps():
      return
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave(data_state)), force=True)

  def restore(self, like: Any) -> tuple[Any, dict[str, Any], int] | None:
    """The latest readable checkpoint into the shardings of `like` (a state
    of arrays or ShapeDtypeStructs), or None when there is none."""
    _check_every_process_holds(like)
    target = _abstract(like)
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target),
            data=ocp.args.JsonRestore()))
      except Exception as e:  # pylint: disable=broad-exception-caught
        logging.warning('checkpoint %d in %s is unreadable (%s: %s); using '
                        'the one before', step, self.directory,
                        type(e).__name__, str(e)[:200])
        continue
      return restored.state, restored.data, step
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


def _check_every_process_holds(state: Any) -> None:
  """Orbax writes each array from the processes that hold a share of it and
  expects every process to hold one: a state on some hosts' devices only (a
  disaggregated multi-controller layout) could never be saved."""
  if jax.process_count() == 1:
    return
  for x in jax.tree.leaves(state):
    processes = {d.process_index for d in x.sharding.device_set}
    if len(processes) < jax.process_count():
      raise UsageError(
          f'the trained state lives on the devices of processes '
          f'{sorted(processes)} only, and multi-controller checkpoints need '
          f'a share on each of the {jax.process_count()}; give the actor '
          'devices on every host (e.g. --config.meshes.actor.devices=all '
          'with --config.meshes.layout=collocated) or run on Pathways.')
