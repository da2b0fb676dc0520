"""Where a run's time goes: goodput (productive step time over wall time)
with the time lost to compilation, checkpoints, data waits, evaluation,
start-up and restarts; and a JAX profiler trace of chosen steps.

Productive time is the training loop's time less what it lost inside it.
Wall time runs from when the job's modules loaded (a pipeline's later
stage: from the end of the one before); a resumed run adds the
steps it redoes (those its predecessor did after the checkpoint it
resumes from), which are lost twice over: counted in the denominator, not
the numerator. The time to the first step counts from the process start,
as a user waits for it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from typing import Any, Iterator

from etils import epath
import jax
import psutil

from tunix_pw import workdir as workdir_lib
from tunix_pw.errors import UsageError

_SINCE = [time.perf_counter()]  # where the next summary's wall time starts
_THREAD = threading.local()  # .compiled: this thread's compilation seconds
# Tracing, lowering and XLA compilation, as JAX reports them.
_COMPILE_EVENTS = ('/jax/core/compile/jaxpr_trace_duration',
                   '/jax/core/compile/jaxpr_to_mlir_module_duration',
                   '/jax/core/compile/backend_compile_duration')
_LISTENERS: list[Any] = []
# The end of the compile time counted so far: threads compile at once (the
# rollout's beside the trainer's) and traces nest, so a run's compilation is
# the union of the events' intervals, never more than its wall time.
_COUNTED_UNTIL = [0.0]
_LOCK = threading.Lock()


def _on_event(event: str, duration: float, **kwargs) -> None:
  del kwargs
  if event in _COMPILE_EVENTS:
    _THREAD.compiled = _compiled() + duration
    with _LOCK:
      now = time.perf_counter()
      new = now - max(now - duration, _COUNTED_UNTIL[0])
      _COUNTED_UNTIL[0] = max(_COUNTED_UNTIL[0], now)
      for goodput in _LISTENERS:
        goodput.add('compilation', max(new, 0.0))


def _compiled() -> float:
  return getattr(_THREAD, 'compiled', 0.0)


jax.monitoring.register_event_duration_secs_listener(_on_event)


class Goodput:
  """One run's time accounting; `summary` ends it."""

  def __init__(self, redone_s: float = 0.0):
    self.lost_s = dict(compilation=0.0, checkpoints=0.0, data=0.0,
                       evaluation=0.0)
    self.redone_s, self.loop_s, self._inside = redone_s, 0.0, None
    self.first_step_s = None  # from the process start to the first step's end
    _LISTENERS.append(self)

  def stepped(self) -> None:
    """A step of this run ended."""
    if self.first_step_s is None:
      self.first_step_s = time.time() - psutil.Process().create_time()

  def add(self, kind: str, seconds: float) -> None:
    self.lost_s[kind] += seconds
    if self._inside is not None:
      self._inside += seconds

  @contextlib.contextmanager
  def lost(self, kind: str) -> Iterator[None]:
    """Time in the block is lost to `kind` (what this thread compiles in
    it is counted as compilation; other threads, e.g. a rollout thread,
    compile beside it)."""
    began, compiled = time.perf_counter(), _compiled()
    try:
      yield
    finally:
      self.add(kind, time.perf_counter() - began - (_compiled() - compiled))

  @contextlib.contextmanager
  def training(self) -> Iterator[None]:
    """The training loop: its time, less what it lost, is productive."""
    began, self._inside = time.perf_counter(), 0.0
    try:
      yield
    finally:
      self.loop_s += time.perf_counter() - began - self._inside
      self._inside = None

  def summary(self, name: str) -> tuple[dict[str, float], str]:
    """The goodput metrics and their one-line summary."""
    if self in _LISTENERS:
      _LISTENERS.remove(self)
    now = time.perf_counter()
    wall, _SINCE[0] = now - _SINCE[0], now
    startup = max(wall - self.loop_s - sum(self.lost_s.values()), 0.0)
    goodput = self.loop_s / (wall + self.redone_s)
    lost = dict(self.lost_s, other=startup, restarts=self.redone_s)
    values = {'goodput': goodput, 'goodput/wall_s': wall,
              'goodput/productive_s': self.loop_s,
              **{f'goodput/{k}_s': v for k, v in lost.items()}}
    line = (f'{name}: goodput {goodput:.1%} of {wall + self.redone_s:.1f} s '
            f'(productive steps {self.loop_s:.1f} s; lost: ' + ', '.join(
                f'{k} {v:.1f} s' for k, v in lost.items()) + ')')
    if self.first_step_s is not None:
      values['time/first_step_s'] = self.first_step_s
      line += f'; first step done {self.first_step_s:.1f} s after the start'
    return values, line


def profile_window(spec: str, steps: int) -> range:
  """The steps (1-based) of `--config.runtime.profile_steps` ('5', '5:8':
  steps 5, 6 and 7; '' none)."""
  if not spec:
    return range(0)
  try:
    first, _, end = spec.partition(':')
    window = range(int(first), int(end) if end else int(first) + 1)
  except ValueError:
    window = range(0)
  if not window or window.start < 1 or window.stop - 1 > steps:
    raise UsageError(f'--config.runtime.profile_steps={spec!r} must be a '
                     f'step N or steps N:M (M excluded) within 1..{steps}.')
  return window


class Profiler:
  """A JAX profiler trace (TensorBoard and Perfetto) of the steps in
  `window`, written to <workdir>/profile on the coordinator (for a gs://
  workdir, traced to a local folder and uploaded when it ends)."""

  def __init__(self, window: range, workdir: str, enabled: bool):
    self.window, self.enabled, self.active = window, enabled, False
    self.directory = workdir_lib.path(workdir, workdir_lib.PROFILE)
    self.remote, self.local = workdir_lib.is_remote(workdir), self.directory

  def before(self, step: int) -> None:
    """Before step `step` (1-based) runs (a resumed run traces the rest of
    the window)."""
    if self.enabled and step in self.window and not self.active:
      if self.remote:
        self.local = tempfile.mkdtemp(prefix='tunix_pw_profile_')
      os.makedirs(self.local, exist_ok=True)
      jax.profiler.start_trace(self.local, create_perfetto_trace=True)
      self.active = True

  def after(self, step: int, state: Any) -> None:
    """After step `step`: the trace ends with the window, once `state` is
    computed."""
    if self.active and step >= self.window.stop - 1:
      jax.block_until_ready(state)
      jax.profiler.stop_trace()
      self.active = False
      if self.remote:
        for root, _, files in os.walk(self.local):
          for name in files:
            source = os.path.join(root, name)
            target = epath.Path(self.directory) / os.path.relpath(
                source, self.local)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(epath.Path(source).read_bytes())
