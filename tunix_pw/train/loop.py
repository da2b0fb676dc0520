"""The bookkeeping every training loop repeats, as functions it calls:
resuming, logging at a cadence without a device sync per step, and the
end-of-step duties (checkpoint cadence, preemption)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tunix_pw import console
from tunix_pw.runtime.fetch import fetch
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.runtime.throttle import InflightThrottler
from tunix_pw.train import metrics
from tunix_pw.train.checkpoint import Checkpointer

def resume(checkpointer: Checkpointer, state: Any, data: Any, name: str,
           announce: bool) -> tuple[Any, int]:
  """The latest checkpoint's state (and the data iterator moved to it), or
  the fresh state at step 0."""
  restored = checkpointer.restore(state)
  if restored is None:
    return state, 0
  state, data_state, step = restored
  data.restore(data_state)
  if announce:
    print(f'{name}: resumed from step {step}', flush=True)
  return state, step


class Tracker:
  """Step metrics: kept on device, fetched and written every `every` steps
  (and at the last), with throughput and the compilation count; at most
  `max_inflight` steps run ahead of the device."""

  def __init__(self, writer: metrics.Writer, bar: console.Progress,
               every: int, last: int, max_inflight: int):
    self.writer, self.bar, self.every, self.last = writer, bar, every, last
    self.throttler = InflightThrottler(max_inflight)
    self._pending, self._tokens, self._clock = 0, 0, time.perf_counter()

  def add(self, done: int, step_metrics: Any, tokens: int,
          shown: tuple[str, ...] = ('loss',)) -> None:
    self.throttler.add(step_metrics)
    self._pending += 1
    self._tokens += tokens
    if done % self.every and done != self.last:
      return
    seconds = time.perf_counter() - self._clock
    values = self.writer.write(done, dict(
        fetch(step_metrics), tokens_per_s=self._tokens / seconds,
        step_seconds=seconds / self._pending,
        compilations=metrics.compilations()))
    self.bar.update(self._pending, **{k: values[k] for k in shown})
    self._pending, self._tokens, self._clock = 0, 0, time.perf_counter()


def end_of_step(done: int, every: int, save: Callable[[int], None],
                checkpointer: Checkpointer, preemption: Preemption) -> None:
  """Checkpoint every `every` steps; the preemption check (a checkpoint,
  then exit 42)."""
  if every and done % every == 0:
    save(done)

  def save_and_wait():
    save(done)
    checkpointer.wait()

  preemption.check(save_and_wait)
