"""The bookkeeping every training loop repeats, as functions it calls:
resuming, logging at a cadence without a device sync per step, the
end-of-step duties (checkpoint cadence, preemption), and `Session` /
`run_steps`, the skeleton a trainer's loop is built on."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from tunix_pw import console
from tunix_pw.errors import UsageError
from tunix_pw.runtime.fetch import fetch
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.runtime.throttle import InflightThrottler
from tunix_pw.train import metrics
from tunix_pw.train import checkpoint as checkpoint_lib
from tunix_pw.train import evaluate as evaluate_lib
from tunix_pw.train import goodput as goodput_lib
from tunix_pw.train.checkpoint import Checkpointer
from tunix_pw.train.step import TrainState


@jax.jit
def all_finite(tree: Any) -> jax.Array:
  """Whether every element of `tree` is finite: one program (per-leaf eager
  checks would compile and dispatch two small programs for each leaf)."""
  return jnp.all(jnp.stack([jnp.isfinite(x).all()
                            for x in jax.tree.leaves(tree)]))


def resume(checkpointer: Checkpointer, state: Any, data: Any, name: str,
           announce: bool) -> tuple[Any, int]:
  """The latest checkpoint's state (and the data iterator moved to it), or
  the fresh state at step 0."""
  restored = checkpointer.restore(state)
  if restored is None:
    return state, 0
  state, data_state, step, written = restored
  data.restore(data_state)
  if announce:
    now = checkpoint_lib.topology(state)
    processes = written.get('processes', 0)
    moved = (f' (written on {written["devices"]} devices by {processes} '
             f'process{"es" * (processes != 1)}; now {now["devices"]} and '
             f'{now["processes"]})' if written and written != now else '')
    print(f'{name}: resumed from step {step}{moved}', flush=True)
  return state, step


class Tracker:
  """Step metrics: kept on device, fetched and written every `every` steps
  (and at the last), with throughput and the compilation count; at most
  `max_inflight` steps run ahead of the device."""

  def __init__(self, writer: metrics.Writer, bar: console.Progress,
               every: int, last: int, max_inflight: int,
               max_nonfinite: int = 0):
    self.writer, self.bar, self.every, self.last = writer, bar, every, last
    self.max_nonfinite = max_nonfinite
    self.throttler = InflightThrottler(max_inflight)
    self._pending, self._tokens, self._clock = 0, 0, time.perf_counter()

  def add(self, done: int, step_metrics: Any, tokens: int,
          shown: tuple[str, ...] = ('loss',)) -> None:
    self.throttler.add(step_metrics)
    self._pending += 1
    self._tokens += tokens
    if done % self.every and done != self.last:
      self.bar.update()  # the step counts; its values show at the log steps
      return
    seconds = time.perf_counter() - self._clock
    values = self.writer.write(done, dict(
        fetch(step_metrics), tokens_per_s=self._tokens / seconds,
        step_seconds=seconds / self._pending,
        compilations=metrics.compilations()))
    check_finite(values, self.max_nonfinite, done)
    self.bar.update(**{k: values[k] for k in shown})
    self._pending, self._tokens, self._clock = 0, 0, time.perf_counter()


def check_finite(values: dict[str, float], limit: int, step: int) -> None:
  """Stops the run (UsageError) once `limit` steps in a row were skipped
  for a non-finite loss or gradient norm."""
  if limit and values.get('nonfinite_streak', 0) >= limit:
    raise UsageError(
        f'{int(values["nonfinite_streak"])} steps in a row up to step {step} '
        'had a non-finite loss or gradient norm and were skipped; lower the '
        'learning rate, check the data, or raise '
        '--config.optimizer.max_nonfinite_steps.')


class Session:
  """What every training loop keeps around its steps: the checkpointer (the
  state resumed from it at `start`), the metrics writer, saves with the
  data position, and the close. The loop updates `state` after each step."""

  def __init__(self, name: str, config: Any, runtime: Any, workdir: str,
               state: Any, data: Any):
    self.name, self.config, self.runtime, self.data = (name, config, runtime,
                                                       data)
    self.checkpointer = Checkpointer(workdir, config.checkpoint.keep,
                                     config.checkpoint.async_save,
                                     checkpoint_lib.holders(state))
    self.state, self.start = resume(self.checkpointer, state, data, name,
                                    runtime.is_coordinator)
    self.last = self.start
    self.writer = metrics.Writer(workdir, runtime.is_coordinator)
    self.goodput = goodput_lib.Goodput(self.writer.resume(self.start))
    self.profiler = goodput_lib.Profiler(
        goodput_lib.profile_window(config.runtime.profile_steps,
                                   config.steps),
        workdir, runtime.is_coordinator)

  def save(self, step: int, data_state: Any = None) -> None:
    """A checkpoint of `state` at `step`, with the data position now (or
    `data_state`, where a step began); never of non-finite parameters."""
    trained = jax.tree.leaves(self.state, is_leaf=lambda x: isinstance(
        x, TrainState))  # PPO's policy and critic, each on its mesh
    if not all(fetch([all_finite(s.params) for s in trained])):
      raise UsageError(f'the parameters at step {step} hold NaN or inf: not '
                       'checkpointing them (the last checkpoint is kept).')
    with self.goodput.lost('checkpoints'):
      self.checkpointer.save(step, self.state, self.data.state()
                             if data_state is None else data_state)
    self.last = step

  def save_and_wait(self, step: int, data_state: Any = None) -> None:
    """`save`, then until it is written: what a stop keeps."""
    self.save(step, data_state)
    self.wait()

  def batch(self) -> Any:
    """The next batch of the data, its wait counted."""
    with self.goodput.lost('data'):
      return next(self.data)

  def evaluated(self, step: int, evaluate: Callable[[], dict[str, Any]]
                ) -> dict[str, float]:
    """`evaluate()`'s metrics, timed and written at `step`, and said
    (the last step's is the job's to say)."""
    with self.goodput.lost('evaluation'):
      result = self.writer.write(step, evaluate())
    if self.runtime.is_coordinator and step != self.config.steps:
      console.say(evaluate_lib.summary(f'{self.name}: step {step}', result))
    return result

  def wait(self) -> None:
    """Until the checkpoints being written are."""
    with self.goodput.lost('checkpoints'):
      self.checkpointer.wait()

  def end_of_step(self, done: int, preemption: Preemption,
                  data_state: Any = None) -> None:
    """The checkpoint cadence and the preemption check, with the data
    position now (or `data_state`)."""
    self.profiler.after(done, self.state)
    self.goodput.stepped()
    self.last = done
    every = self.config.checkpoint.every
    if every and done % every == 0:
      self.save(done, data_state)
    preemption.check(lambda: self.save_and_wait(done, data_state))

  def close(self) -> None:
    """Waits for the last checkpoint; writes and prints the goodput."""
    self.wait()
    self.checkpointer.close()
    values, line = self.goodput.summary(self.name)
    self.writer.goodput(self.last, values)
    self.writer.close()
    if self.runtime.is_coordinator:
      print(line, flush=True)


def run_steps(session: Session, preemption: Preemption,
              step_fn: Callable[[int], tuple[Any, int]],
              shown: tuple[str, ...],
              stop_after: Callable[[int], bool] = lambda done: False) -> int:
  """Steps from `session.start` to the config's `steps`, with a progress
  bar, metrics at the log cadence and the end-of-step duties.
  `step_fn(index)` runs one step (updating `session.state`) and returns
  (its metrics on device, its tokens); `stop_after(done)` True ends the
  run there. Returns the last step done."""
  config = session.config
  with console.Progress(config.steps - session.start, session.name,
                        enabled=session.runtime.is_coordinator) as bar:
    tracker = Tracker(session.writer, bar, config.log_every, config.steps,
                      config.runtime.max_inflight,
                      config.optimizer.max_nonfinite_steps)
    with session.goodput.training():
      for index in range(session.start, config.steps):
        session.profiler.before(index + 1)
        step_metrics, tokens = step_fn(index)
        done = index + 1
        tracker.add(done, step_metrics, tokens, shown=shown)
        if stop_after(done):
          tracker.throttler.wait_for_all()
          return done
        session.end_of_step(done, preemption)
      tracker.throttler.wait_for_all()
  return config.steps
