"""Asynchronous RL: the rollouts of later steps are generated while the
trainer updates on earlier ones, at most `max_staleness` policy versions
behind (`--config.rl.max_staleness=k`).

A rollout thread generates step i's groups once the policy the rollout
engine serves is at version i - k or newer (version v: the weights after v
steps); a scoring thread scores them (rewards, verifiers, judges), so a slow
verifier overlaps the next generation and the update; the trainer takes the
rollouts in step order and publishes each new version after its weight
sync. k = 0 is the synchronous loop: step i's rollout waits for the weights
of step i - 1, and the thread reads step i's prompts while it waits
(Lookahead), off the step's critical path. Every rollout carries its data
position before and after it, so a checkpoint holds the position of the
last rollout trained on and a resumed run regenerates the ones that were
in flight.

Threads need one controller (Pathways, or one process): in a
multi-controller job every process must launch its device programs in the
same order, so there (`threaded=False`, k = 0 only) each rollout is
generated and scored when the trainer asks for it.

  rollouts = Rollouts(stages, data, start, steps, max_staleness)
  for index in range(start, steps):
    ready = rollouts.get(index)     # ready.result: the step's Rollout
    ... update, weight sync ...
    rollouts.published(index + 1)
  rollouts.close()
"""

from __future__ import annotations

from collections.abc import Callable
import concurrent.futures
import dataclasses
import queue
import threading
import time
from typing import Any

import numpy as np

from tunix_pw.errors import UsageError
from tunix_pw.rl import phases


def check(config: Any) -> None:
  """The asynchronous settings: bounds, and a layout with something to
  overlap."""
  rl = config.rl
  if rl.max_staleness < 0 or rl.decode_chunk < 0:
    raise UsageError(f'--config.rl.max_staleness={rl.max_staleness} and '
                     f'decode_chunk={rl.decode_chunk} must be at least 0 (0: '
                     'synchronous; one decode loop).')
  if rl.max_staleness and config.meshes.layout != 'disaggregated':
    raise UsageError('--config.rl.max_staleness overlaps the rollout with '
                     'the update, which needs the rollout on devices of its '
                     "own: use --config.meshes.layout='disaggregated'.")


def check_controllers(config: Any, process_count: int) -> None:
  """Threads need one controller (module docstring)."""
  if config.rl.max_staleness and process_count > 1:
    raise UsageError('--config.rl.max_staleness needs one controller '
                     '(Pathways or one process): in a multi-controller job '
                     'every process must launch its device programs in the '
                     'same order.')


@dataclasses.dataclass(frozen=True)
class Ready:
  """A step's scored rollout, with where it came from."""

  result: phases.Rollout
  version: int  # the policy version it was sampled from
  data_before: Any  # the data position where it began ...
  data_after: Any  # ... and where it ended
  seconds: float  # generating and scoring it
  rollout_wait: float  # seconds the rollout thread waited for the weights
  trainer_wait: float  # seconds the trainer waited for it
  queue_depth: int  # rollouts generated ahead of the trainer when it asked

  def metrics(self, index: int) -> dict[str, float]:
    """The step's timeline and staleness: the rollout's (that of its
    oldest token) and, where the engine records versions, the fraction of
    the generated tokens per staleness (`token_staleness/s`)."""
    values = {'staleness': index - self.version,
              'time/trainer_wait': self.trainer_wait,
              'time/rollout_wait': self.rollout_wait,
              'queue_depth': self.queue_depth}
    versions = [v for g in self.result.real for c in g.versions or ()
                for v in c]
    if versions:
      stale, counts = np.unique(index - np.asarray(versions),
                                return_counts=True)
      values.update({f'token_staleness/{s}': c / len(versions)
                     for s, c in zip(stale.tolist(), counts.tolist())})
    return values


class Rollouts:
  """Step rollouts from a thread, ahead of the trainer (module docstring).

  `stages(index)` generates step `index`'s rollout and returns the function
  that scores it into a `phases.Rollout`; `data` is the iterator it draws
  prompts from (its `state()` is read around each rollout)."""

  def __init__(self, stages: Callable[[int], Callable[[], phases.Rollout]],
               data: Any, start: int, steps: int, max_staleness: int,
               threaded: bool = True):
    self._stages, self._data, self._k = stages, data, max_staleness
    self._threaded, self._version, self._closed = threaded, start, False
    self._changed = threading.Condition()
    self._pending: queue.Queue = queue.Queue()
    self._scoring = concurrent.futures.ThreadPoolExecutor(
        1, thread_name_prefix='scoring')
    self._thread = threading.Thread(target=self._generate,
                                    args=(start, steps), daemon=True,
                                    name='rollout')
    if threaded:
      self._thread.start()

  def _generate(self, start: int, steps: int) -> None:
    read_ahead = getattr(self._data, 'read_ahead', None)
    for index in range(start, steps):
      began = time.perf_counter()
      if read_ahead:  # the step's prompts, while the weights are not here
        read_ahead()
      with self._changed:
        self._changed.wait_for(
            lambda: self._closed or self._version >= index - self._k)
        if self._closed:
          return
      if not self._next(index, time.perf_counter() - began):
        return

  def _next(self, index: int, waited: float) -> bool:
    """Generates step `index`'s rollout and queues its scoring; False if
    it failed (the failure is queued)."""
    version = self._version
    before, began = self._data.state(), time.perf_counter()
    try:
      score = self._stages(index)
    except BaseException as e:  # pylint: disable=broad-exception-caught
      failed = concurrent.futures.Future()
      failed.set_exception(e)
      self._pending.put((failed, version, before, None, 0.0, waited))
      return False
    self._pending.put((self._scoring.submit(_timed, score), version, before,
                       self._data.state(), time.perf_counter() - began,
                       waited))
    return True

  def get(self, index: int) -> Ready:
    """Step `index`'s rollout (in order), once scored; a failure on the
    rollout side is raised here."""
    began, depth = time.perf_counter(), self._pending.qsize()
    if not self._threaded:
      self._next(index, 0.0)  # generated now
    future, version, before, after, seconds, waited = self._pending.get()
    result, scoring = future.result()
    assert index - version <= self._k, (index, version)
    return Ready(result, version, before, after, seconds + scoring, waited,
                 time.perf_counter() - began, depth)

  def published(self, version: int) -> None:
    """The rollout engine now serves the weights of `version`."""
    with self._changed:
      self._version = version
      self._changed.notify_all()

  def close(self) -> None:
    """Stops generating (the rollout in progress finishes) and scoring."""
    with self._changed:
      self._closed = True
      self._changed.notify_all()
    if self._thread.is_alive():
      self._thread.join()
    self._scoring.shutdown(wait=True, cancel_futures=True)


class Lookahead:
  """A prompt iterator (`next`, `state`, `restore`) that the rollout
  thread can read one batch ahead (`read_ahead`): a synchronous step's
  rollout waits for the previous step's weights, and reading its prompts
  during that wait takes the data read off the step's critical path.
  `state()` stays where the batch read ahead begins until it is taken."""

  def __init__(self, data: Any):
    self._data, self._ahead = data, None  # (state before, batch or error)

  def read_ahead(self) -> None:
    if self._ahead is None:
      before = self._data.state()
      try:
        self._ahead = before, next(self._data)
      except BaseException as e:  # pylint: disable=broad-exception-caught
        self._ahead = before, e  # raised where the batch is taken

  def __iter__(self):
    return self

  def __next__(self) -> Any:
    if self._ahead is None:
      return next(self._data)
    (_, batch), self._ahead = self._ahead, None
    if isinstance(batch, BaseException):
      raise batch
    return batch

  def state(self) -> Any:
    return self._data.state() if self._ahead is None else self._ahead[0]

  def restore(self, state: Any) -> None:
    self._ahead = None
    self._data.restore(state)


def _timed(score: Callable[[], phases.Rollout]) -> tuple[phases.Rollout,
                                                         float]:
  began = time.perf_counter()
  return score(), time.perf_counter() - began
