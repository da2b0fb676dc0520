"""Metrics: a JSONL file and TensorBoard event files in the workdir, and the
count of XLA compilations (a recompiling step is a bug worth seeing)."""

from __future__ import annotations

import json
import sys
import weakref
from typing import Any

import jax
import numpy as np

from tunix_pw import workdir as workdir_lib

_COMPILES = [0]


def _count(event: str, duration: float, **kwargs) -> None:
  del duration, kwargs
  if event == '/jax/core/compile/backend_compile_duration':
    _COMPILES[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count)


def compilations() -> int:
  """XLA compilations in this process so far."""
  return _COMPILES[0]


def _summary_writer() -> type[Any]:
  """tensorboardX's SummaryWriter, imported with torch hidden: tensorboardX
  imports torch wherever it is installed (1.0-1.4 s of every job's start
  here) only to accept torch tensors, and we give it floats. A process that
  imported torch itself keeps it."""
  hide = 'torch' not in sys.modules
  if hide:
    sys.modules['torch'] = None  # `import torch` raises ImportError
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  finally:
    if hide:
      del sys.modules['torch']
  return SummaryWriter


class Writer:
  """Scalars per step to <workdir>/metrics.jsonl and TensorBoard (only the
  coordinator writes)."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled, self.workdir = enabled, workdir
    self.path = workdir_lib.path(workdir, workdir_lib.METRICS)
    self._tb = None
    if enabled:
      self._tb = _summary_writer()(workdir_lib.path(workdir,
                                                    workdir_lib.TENSORBOARD))
      _OPEN.add(self)

  def write(self, step: int, scalars: dict[str, Any]) -> dict[str, float]:
    values = {k: float(np.asarray(v)) for k, v in scalars.items()}
    if self.enabled:
      workdir_lib.append_text(self.path,
                              json.dumps(dict(step=step, **values)) + '\n')
      for k, v in values.items():
        self._tb.add_scalar(k, v, step)
      self._tb.flush()
    return values

  def resume(self, step: int) -> float:
    """Keeps the records up to `step`, the checkpoint a run resumes from
    (none when it starts from scratch): the steps after it are redone. A
    torn last line goes too; the file is replaced whole. Returns the
    seconds the earlier run spent on the steps to redo (0 if unknown)."""
    if not self.enabled or not workdir_lib.exists(self.path):
      return 0.0
    records = read_file(self.path)
    workdir_lib.write_text(self.path, ''.join(
        json.dumps(r) + '\n' for r in records
        if step and r.get('step', 0) <= step))
    return redone_seconds(records, step)

  def goodput(self, step: int, values: dict[str, float]) -> None:
    """A run's goodput figures: TensorBoard scalars at `step`, and
    <workdir>/goodput.json (replaced whole)."""
    if not self.enabled:
      return
    for k, v in values.items():
      self._tb.add_scalar(k, v, step)
    self._tb.flush()
    workdir_lib.write_text(workdir_lib.path(self.workdir, workdir_lib.GOODPUT),
                           json.dumps(dict(step=step, **values), indent=1))

  def samples(self, step: int, records: list[dict[str, Any]]) -> None:
    """Sample records to <workdir>/samples.jsonl (one line each, with the
    step) and as TensorBoard text."""
    if not self.enabled:
      return
    workdir_lib.append_text(
        workdir_lib.path(self.workdir, workdir_lib.SAMPLES),
        ''.join(json.dumps(dict(step=step, **r)) + '\n' for r in records))
    self._tb.add_text('samples', '\n\n'.join(
        f'**{r["prompt"]!r}** -> ' + ', '.join(
            f'{c!r} ({reward:g})' for c, reward in zip(r['completions'],
                                                      r['rewards']))
        for r in records), step)
    self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      _OPEN.discard(self)


_OPEN: weakref.WeakSet[Writer] = weakref.WeakSet()


def close_all() -> None:
  """Closes the writers a failing job left open: TensorBoard's writer
  closed only at interpreter exit needs a new thread, which Python 3.12
  refuses then (a traceback after the job's one-sentence error)."""
  for writer in list(_OPEN):
    writer.close()


def redone_seconds(records: list[dict[str, float]], step: int) -> float:
  """The time logged records spent on the steps after `step`: their count
  times the median step time they logged."""
  after = [r for r in records if r.get('step', 0) > step]
  times = sorted(r.get('step_seconds', r.get('time/step')) for r in after
                 if 'step_seconds' in r or 'time/step' in r)
  if not times:
    return 0.0
  return (max(r['step'] for r in after) - step) * times[len(times) // 2]


def read(workdir: str) -> list[dict[str, float]]:
  return read_file(workdir_lib.path(workdir, workdir_lib.METRICS))


def read_file(path: str) -> list[dict[str, float]]:
  """The records of a metrics.jsonl; a torn last line (a write cut short)
  is left out."""
  lines = workdir_lib.read_text(path).splitlines()
  records = []
  for i, line in enumerate(lines):
    try:
      records.append(json.loads(line))
    except ValueError:
      if i < len(lines) - 1:
        raise
  return records
